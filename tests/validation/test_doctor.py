"""`dflash-gguf doctor` on the trained pair: a healthy pair passes, and each finding is triggered by
a fixture made to have it (exit 1, the finding's check named), bad input exits 2."""

from __future__ import annotations

import json
import shutil

import pytest
from gguf import GGUFValueType

from dflash_gguf.gguf.format import KV
from dflash_gguf.gguf.reader import GGUFFile
from tests.conftest import dflash_gguf
from tests.refusal import assert_refused
from training.fixtures.trained_gguf import TRAINED
from training.fixtures.gguf_edit import edited_copy
from tests.legacy_fixture import make_legacy
from tests.malformed import edit_config

pytestmark = pytest.mark.integration

QUIET = ["--", "-t", "1"]


@pytest.fixture(scope="module")
def prompts(trained_pair, tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text("".join(trained_pair["prompts"].read_text().splitlines(keepends=True)[:2]))
    return path


def doctor(target, draft, *args):
    proc = dflash_gguf("doctor", "--target", target, "--draft", draft, "--json", "--backend", "cpu", *args)
    report = json.loads(proc.stdout) if proc.returncode in (0, 1) else None
    return proc, report


def checks(report) -> list[str]:
    return [f["check"] for f in report["findings"]]


def test_healthy_pair_measured_and_clean(trained_pair, prompts):
    proc, report = doctor(trained_pair["target"], trained_pair["dflash"], "--prompts", prompts, *QUIET)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert report["ok"] and report["findings"] == []
    # the JSON's keys, as before the report was typed (validation/doctor.py DoctorReport.to_dict)
    assert list(report) == ["target", "draft", "server_args", "ok", "findings", "measured", "card_tau"]
    assert list(report["measured"]) == ["prompts", "produced", "drafted", "accepted", "tau", "acceptance_rate",
                                        "acceptance_per_position"]
    m = report["measured"]
    assert m["drafted"] > 0 and m["accepted"] > 0 and m["tau"] > 1.5
    assert m["acceptance_per_position"] and 0 < m["acceptance_per_position"][0] <= 1
    # a position's acceptance never exceeds the one before it: a token is accepted only after its predecessors
    assert all(a >= b for a, b in zip(m["acceptance_per_position"], m["acceptance_per_position"][1:]))


def test_legacy_file(trained_pair, tmp_path):
    legacy = make_legacy(trained_pair["dflash"], tmp_path / "dflash-legacy.gguf")
    proc, report = doctor(trained_pair["target"], legacy, *QUIET)
    assert proc.returncode == 1 and checks(report) == ["legacy-file"] and report["measured"] is None
    assert "dflash-gguf convert" in report["findings"][0]["message"]


def test_mrope_sections_missing(trained_pair, tmp_path):
    mrope = edited_copy(trained_pair["target"], tmp_path / "target-mrope.gguf", set_kv=(
        KV("qwen3.rope.dimension_sections", GGUFValueType.ARRAY, [16, 16, 0, 0], GGUFValueType.INT32),))
    proc, report = doctor(mrope, trained_pair["dflash"], "--no-run")
    assert proc.returncode == 1 and checks(report) == ["mrope-sections"]


def test_sliding_window_keys_missing(trained_pair, tmp_path):
    checkpoint = tmp_path / "dflash-swa"
    shutil.copytree(TRAINED / "dflash", checkpoint)
    n_layers = json.loads((checkpoint / "config.json").read_text())["num_hidden_layers"]
    edit_config(checkpoint, use_sliding_window=True, sliding_window=64,
                layer_types=["sliding_attention"] * (n_layers - 1) + ["full_attention"])
    proc, report = doctor(trained_pair["target"], trained_pair["dflash"], "--checkpoint", checkpoint, "--no-run")
    assert proc.returncode == 1 and checks(report) == ["sliding-window"]
    # the same checkpoint without sliding-window layers: nothing to find
    edit_config(checkpoint, use_sliding_window=False)
    proc, report = doctor(trained_pair["target"], trained_pair["dflash"], "--checkpoint", checkpoint, "--no-run")
    assert proc.returncode == 0, proc.stdout


def test_tokenizer_mismatch(trained_pair, tmp_path):
    with GGUFFile(trained_pair["dflash"]) as f:
        tokens = list(f.get("tokenizer.ggml.tokens"))
    tokens[100] = tokens[100] + "x"
    other = edited_copy(trained_pair["dflash"], tmp_path / "dflash-other-vocab.gguf", set_kv=(
        KV("tokenizer.ggml.tokens", GGUFValueType.ARRAY, tokens, GGUFValueType.STRING),))
    proc, report = doctor(trained_pair["target"], other, *QUIET)
    assert proc.returncode == 1 and checks(report) == ["tokenizer"]
    assert "first difference at id 100" in report["findings"][0]["message"]


def test_target_that_records_no_layer_inputs(trained_pair, tmp_path):
    qwen2 = edited_copy(trained_pair["target"], tmp_path / "target-qwen2.gguf", rename_prefix=("qwen3.", "qwen2."),
                        set_kv=(KV("general.architecture", GGUFValueType.STRING, "qwen2"),))
    proc, report = doctor(qwen2, trained_pair["dflash"], *QUIET)
    assert proc.returncode == 1 and checks(report) == ["target-taps"] and report["measured"] is None


def test_taps_beyond_the_target(trained_pair, tmp_path):
    deep = edited_copy(trained_pair["dflash"], tmp_path / "dflash-deep.gguf", set_kv=(
        KV("dflash.target_layers", GGUFValueType.ARRAY, [2, 40], GGUFValueType.INT32),))
    proc, report = doctor(trained_pair["target"], deep, *QUIET)
    assert proc.returncode == 1 and checks(report) == ["target-taps"]


@pytest.mark.parametrize("args, check", [
    (["-ctkd", "q8_0"], "draft-kv-cache"),
    (["--cache-type-v-draft=q4_0"], "draft-kv-cache"),
    (["--spec-draft-p-min", "0.5"], "draft-p-min"),
    (["-np", "8"], "parallel-slots"),
])
def test_server_argument_findings(args, check, trained_pair):
    proc, report = doctor(trained_pair["target"], trained_pair["dflash"], "--no-run", "--", *args)
    assert proc.returncode == 1 and checks(report) == [check]


@pytest.mark.parametrize("drafter, args, found", [
    ("dflash2", ["-sm", "tensor"], ["split-mode"]),
    ("dspark", ["--split-mode=tensor", "-ctkd", "q8_0"], ["draft-kv-cache", "split-mode"]),
    ("dflash", ["-sm", "tensor"], []),
    ("dflash2", ["-sm", "layer"], []),
])
def test_tensor_split_with_dflash2_or_dspark(drafter, args, found, trained_pair):
    """llama.cpp #27819: --split-mode tensor aborts with DFlash 2 and DSpark drafters, not DFlash."""
    proc, report = doctor(trained_pair["target"], trained_pair[drafter], "--no-run", "--", *args)
    assert proc.returncode == (1 if found else 0) and checks(report) == found, proc.stderr
    if "split-mode" in found:
        assert "--split-mode layer" in report["findings"][-1]["message"]


def test_below_the_release_card(trained_pair, prompts, tmp_path):
    folder = tmp_path / "release"
    folder.mkdir()
    draft = shutil.copy(trained_pair["dflash"], folder / "dflash-tiny-F16.gguf")
    (folder / "README.md").write_text(
        "| File | Type | Recipe | Size | SHA-256 | τ (tokens / step) | Speedup |\n|---|---|---|---:|---|---:|---:|\n"
        "| [dflash-tiny-F16.gguf](./dflash-tiny-F16.gguf) | F16 | - | 3 MiB | `00` | 14.50 | 3.00x |\n")
    proc, report = doctor(trained_pair["target"], draft, "--prompts", prompts, *QUIET)
    assert proc.returncode == 1 and checks(report) == ["acceptance"] and report["card_tau"] == 14.5
    assert report["measured"]["tau"] < 14.5


def test_not_a_gguf_exits_2(trained_pair, tmp_path):
    bogus = tmp_path / "target.gguf"
    bogus.write_bytes(b"not a gguf at all")
    proc, _ = doctor(bogus, trained_pair["dflash"], "--no-run")
    assert_refused(proc, str(bogus))
