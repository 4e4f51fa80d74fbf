"""DSpark drafters (DFlash + a Markov head; tests/fixtures/published_drafters.py): both schemas convert
byte-equal to the pinned converter, under every architecture name it registers; inspect, serve and
release treat them as DSpark (draft length, --spec-type draft-dspark, `dspark-` file names); the
patched llama-server drafts with them.

    dspark-lineage  DSparkDraftModel, settings at the top level, block 7, confidence head, full vocab
    dspark-eagle3   DSparkSpeculator, transformer_layer_config + aux_hidden_state_layer_ids, reduced
                    draft vocabulary (own lm_head, d2t offsets, t2d mask), no confidence head
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from dflash_gguf.gguf.reader import GGUFFile
from tests.conftest import dflash_gguf
from tests.fixtures.published_drafters import cached_published
from training.fixtures.gguf_compare import differences
from tests.refusal import assert_refused

FAMILIES = ["dspark-lineage", "dspark-eagle3"]
ARCHITECTURES = ["Qwen3DSparkModel", "DSparkDraftModel", "DSparkSpeculator", "Lfm2DSparkDraftModel", "LingDSparkModel"]


@pytest.fixture(scope="session")
def published() -> Path:
    return cached_published()


@pytest.fixture(scope="session")
def converted_dspark(published, target_gguf, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("dspark")
    out = {}
    for family in FAMILIES:
        out[family] = folder / f"{family}.gguf"
        proc = dflash_gguf("convert", published / family, "--target", target_gguf, "-o", out[family], "--outtype", "f16")
        assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.upstream
@pytest.mark.parametrize("outtype", ["f16", "bf16", "q8_0"])
@pytest.mark.parametrize("family", FAMILIES)
def test_matches_upstream(family, outtype, published, fixtures, tmp_path):
    from training.fixtures.upstream import run_upstream_converter

    theirs = run_upstream_converter(published / family, tmp_path / "theirs.gguf", outtype, fixtures / "target-hf")
    ours = tmp_path / "ours.gguf"
    proc = dflash_gguf("convert", published / family, "--target", fixtures / "target-hf", "-o", ours, "--outtype", outtype)
    assert proc.returncode == 0, proc.stderr
    assert differences(ours, theirs) == []


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_every_architecture_name_converts_alike(architecture, published, target_gguf, converted_dspark, tmp_path):
    folder = shutil.copytree(published / "dspark-lineage", tmp_path / "drafter")
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = [architecture]
    (folder / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out.gguf"
    proc = dflash_gguf("convert", folder, "--target", target_gguf, "-o", out, "--outtype", "f16", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["variant"] == "dspark"
    assert differences(out, converted_dspark["dspark-lineage"]) == []


def test_dspark_metadata_and_tensors(published, converted_dspark):
    with GGUFFile(converted_dspark["dspark-lineage"]) as f:
        assert f.get("dflash.sample_from_anchor") is True and f.get("dflash.has_confidence_head") is True
        assert f.get("dflash.block_size") == 7 and f.get("dflash.target_layers") == [1, 3, 5]
        assert {"markov_w1.weight", "markov_w2.weight", "conf_proj.weight", "conf_proj.bias"} <= set(f.tensors)
        assert "output.weight" not in f.tensors and "d2t" not in f.tensors  # full vocabulary: the target's head
    t2d = load_file(published / "dspark-eagle3" / "model.safetensors")["t2d"].numpy()
    with GGUFFile(converted_dspark["dspark-eagle3"]) as f:
        assert f.get("dflash.sample_from_anchor") is False and f.get("dflash.has_confidence_head") is False
        # aux_hidden_state_layer_ids count hidden states as llama.cpp does: [1, 3, 5] = target_layer_ids + 1
        assert f.get("dflash.target_layers") == [1, 3, 5]
        assert f.get("tokenizer.ggml.mask_token_id") == 151669
        info = f.tensors["d2t"]
        assert info.type.name == "I64"
        # absolute target ids: exactly the ids the t2d mask marks, in order
        d2t = np.frombuffer(bytes(f.tensor_bytes("d2t")), np.int64)
        np.testing.assert_array_equal(d2t, np.nonzero(t2d)[0])
        assert f.tensors["output.weight"].shape == (d2t.size, 64)
        assert f.tensors["markov_w2.weight"].shape == (d2t.size, 16)
        assert not {"t2d", "conf_proj.weight"} & set(f.tensors)


@pytest.mark.parametrize("family,draft_length", [("dspark-lineage", 7), ("dspark-eagle3", 7)])
def test_inspect_and_serve_read_dspark(family, draft_length, converted_dspark):
    """Anchor-first DSpark drafts a whole block (7 of block 7); the EAGLE3-style one block_size-1 (7 of 8)."""
    from dflash_gguf.runner.launch import speculative_args

    proc = dflash_gguf("inspect", converted_dspark[family], "--json")
    assert proc.returncode == 0, proc.stdout
    report = json.loads(proc.stdout)
    assert (report["variant"], report["draft_length"], report["spec_type"]) == ("DSpark", draft_length, "draft-dspark")
    assert speculative_args(converted_dspark[family])[2:] == ["--spec-type", "draft-dspark",
                                                               "--spec-draft-n-max", str(draft_length)]


def _edit(folder: Path, config: dict | None = None, tensors=None) -> Path:
    if config:
        data = json.loads((folder / "config.json").read_text())
        data.update(config)
        (folder / "config.json").write_text(json.dumps(data))
    if tensors:
        stored = load_file(folder / "model.safetensors")
        tensors(stored)
        save_file(stored, folder / "model.safetensors")
    return folder


def _duplicate(t: dict) -> None:
    t["d2t"][1] = t["d2t"][0] - 1  # draft id 1 maps to the target id of draft id 0


BROKEN = {
    "markov-head-type": ("dspark-lineage", {"markov_head_type": "gated"}, None, ["markov_head_type", "'gated'", "vanilla"]),
    "draft-vocab-too-big": ("dspark-eagle3", {"draft_vocab_size": 200000}, None, ["draft_vocab_size 200000", "151936"]),
    "no-d2t": ("dspark-eagle3", None, lambda t: t.pop("d2t"), ["draft_vocab_size", "d2t"]),
    "d2t-duplicate": ("dspark-eagle3", None, _duplicate, ["d2t", "same target id"]),
    "d2t-out-of-range": ("dspark-eagle3", None, lambda t: t["d2t"].__setitem__(-1, 10**6), ["d2t", "outside"]),
    "d2t-wrong-size": ("dspark-eagle3", None, lambda t: t.update(d2t=t["d2t"][:-1].clone()), ["d2t", "entries"]),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_dspark_is_refused(case, published, target_gguf, tmp_path):
    family, config, tensors, needles = BROKEN[case]
    folder = _edit(shutil.copytree(published / family, tmp_path / "drafter"), config, tensors)
    out = tmp_path / "out.gguf"
    assert_refused(dflash_gguf("convert", folder, "--target", target_gguf, "-o", out), *needles, out=out)


def test_release_names_dspark_files(published, target_gguf, tmp_path):
    """A DSpark release is named dspark-<Target>-<QUANT>.gguf (llama.cpp's -hf sidecar prefix) and its
    card runs it with --spec-type draft-dspark at its whole draft length."""
    drafter = shutil.copytree(published / "dspark-lineage", tmp_path / "drafter")
    (drafter / "README.md").write_text("---\nlicense: apache-2.0\n---\n")
    out = tmp_path / "rel"
    proc = dflash_gguf("release", drafter, "--target", target_gguf, "--types", "F16,BF16", "-o", out,
                       "--target-license", "apache-2.0", "--name", "Tiny-Qwen3", "--base-model", "org/Tiny-DSpark",
                       "--skip-validate", "--json")
    assert proc.returncode == 0, proc.stderr
    files = ["dspark-Tiny-Qwen3-BF16.gguf", "dspark-Tiny-Qwen3-F16.gguf"]
    assert sorted(p.name for p in out.glob("*.gguf")) == files
    card = (out / "README.md").read_text()
    assert card.startswith("---") and "# dspark-Tiny-Qwen3: DSpark drafter GGUF" in card
    assert "--spec-type draft-dspark --spec-draft-n-max 7" in card
    from dflash_gguf.release.publish import plan_upload
    uploads, _ = plan_upload(out)
    assert sorted(u.path for u in uploads if u.path.endswith(".gguf")) == files


@pytest.mark.integration
@pytest.mark.parametrize("family", FAMILIES)
def test_llama_server_drafts(family, llama_bin, target_gguf, converted_dspark, tmp_path):
    from dflash_gguf.runner.launch import speculative_args
    from dflash_gguf.runner.server import LlamaServer

    args = speculative_args(converted_dspark[family]) + ["--parallel", "1", "-c", "512", "-t", "1"]
    with LlamaServer(target_gguf, args, bin_dir=llama_bin, log_path=tmp_path / "server.log") as server:
        answer = server.client.complete("The capital of France is", 24, ignore_eos=True)
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert "draft-dspark" in log
    assert answer.n_predicted == 24
    assert answer.draft_n > 0 and 0 <= answer.draft_n_accepted <= answer.draft_n, answer.timings
