"""`dflash-gguf train` on the trained pair's target GGUF, with the patched llama.cpp as the teacher: a
short run writes a drafter folder that `convert` takes and that llama.cpp runs losslessly (its
held-out tau measured and carded); a run killed mid-way and rerun ends with the same weights as an
uninterrupted one; bad input is one line, exit 2, and leaves nothing behind."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gguf import GGUFValueType

from dflash_gguf.gguf.format import KV
from dflash_gguf.owned_folder import MANIFEST
from dflash_gguf.paths import cache_dir
from tests.conftest import REPO, dflash_gguf
from training.fixtures.gguf_edit import edited_copy

pytest.importorskip("torch")
pytest.importorskip("dflash.model")
pytestmark = pytest.mark.integration

FAST = ["--answer-tokens", "32", "--threads", "1"]


def train(*args) -> subprocess.CompletedProcess:
    return dflash_gguf("train", *args)


def assert_refused(proc: subprocess.CompletedProcess, *words: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in lines[0]


def nothing_beside(folder: Path, out_name: str) -> list[str]:
    """Files or folders named after the output (a partial drafter) in `folder`."""
    return [p.name for p in folder.iterdir() if out_name in p.name]


def test_a_short_run_converts_and_is_lossless(trained_pair, tmp_path):
    out = tmp_path / "drafter"
    proc = train("--target", trained_pair["target"], "--prompts", trained_pair["prompts"], "-o", out,
                 "--steps", "60", "--holdout", "0.25", *FAST, "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "README.md", "config.json", "model.safetensors"]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["hidden_size"] == 256
    assert config["dflash_config"]["target_layer_ids"] == summary["target_layer_ids"]
    held = summary["held_out"]
    assert summary["steps"] == 60 and summary["prompts_held_out"] == 3 and summary["prompts_trained"] == 9
    assert held["lossless"] and held["prompts"] == 3
    assert held["tau"] > 1.0  # drafts accepted: the trained pair's target is repetitive, 60 steps learn some
    card = (out / "README.md").read_text()
    assert f"**{held['tau']:.3f}**" in card and "60" in card
    # the pace over each 25 steps, slowest to fastest: what a shared machine's load did to it
    low, high = summary["step_rates"]
    assert 0 < low <= high and summary["minutes"] is None
    assert f"{low:.2f}-{high:.2f} steps/s over 25-step windows" in card and "budget" not in card
    gguf = tmp_path / "drafter.gguf"
    converted = dflash_gguf("convert", out, "--target", trained_pair["target"], "-o", gguf)
    assert converted.returncode == 0, converted.stderr
    assert nothing_beside(tmp_path, ".drafter") == []


def _checkpoints(since: float) -> list[Path]:
    return [p for p in (cache_dir() / "train").glob("*/ckpt-*.pt") if p.stat().st_mtime >= since]


def test_a_killed_run_resumes_to_the_same_drafter(trained_pair, tmp_path):
    args = ["--target", trained_pair["target"], "--prompts", trained_pair["prompts"], "--steps", "12",
            "--no-validate", "--checkpoint-minutes", "0", *FAST]
    whole = train(*args, "-o", tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr

    started = time.time()
    command = [sys.executable, "-m", "dflash_gguf.cli", "train", *map(str, args), "-o", str(tmp_path / "resumed")]
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    while not _checkpoints(started) and first.poll() is None:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert first.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (tmp_path / "resumed").exists()  # no partial drafter folder
    again = train(*args, "-o", tmp_path / "resumed", "--json")
    assert again.returncode == 0, again.stderr
    assert "resuming at step" in again.stderr
    assert json.loads(again.stdout)["teacher_reused"]  # the first runs' answers, not a teacher time of 0 s
    assert (tmp_path / "resumed" / "model.safetensors").read_bytes() == \
        (tmp_path / "whole" / "model.safetensors").read_bytes()


def test_the_learning_rate_is_the_one_asked_for_and_carded(trained_pair, tmp_path):
    args = ["--target", trained_pair["target"], "--prompts", trained_pair["prompts"], "--steps", "4",
            "--no-validate", *FAST, "--json"]
    default = train(*args, "-o", tmp_path / "default")
    faster = train(*args, "-o", tmp_path / "faster", "--lr", "3e-3")
    assert default.returncode == 0 and faster.returncode == 0, default.stderr + faster.stderr
    assert json.loads(default.stdout)["lr"] == 1.5e-3 and json.loads(faster.stdout)["lr"] == 3e-3
    assert "(peak learning rate 0.003)" in (tmp_path / "faster" / "README.md").read_text()
    assert (tmp_path / "faster" / "model.safetensors").read_bytes() != \
        (tmp_path / "default" / "model.safetensors").read_bytes()


def test_a_timed_run_cards_its_budget(trained_pair, tmp_path):
    proc = train("--target", trained_pair["target"], "--prompts", trained_pair["prompts"], "-o", tmp_path / "timed",
                 "--minutes", "0.2", "--no-validate", *FAST, "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["minutes"] == 0.2 and summary["steps"] > 0
    assert "(budget 0.2 min" in (tmp_path / "timed" / "README.md").read_text()


# --- refusals ---------------------------------------------------------------------------------

def test_a_target_that_records_no_layer_inputs(trained_pair, tmp_path):
    # Qwen2's graph records no layer inputs in the pinned tree; the same weights load as Qwen2 once
    # the q/k norms Qwen2 lacks are left out
    qwen2 = edited_copy(trained_pair["target"], tmp_path / "target-qwen2.gguf", rename_prefix=("qwen3.", "qwen2."),
                        set_kv=(KV("general.architecture", GGUFValueType.STRING, "qwen2"),),
                        drop_tensors=("attn_q_norm.weight", "attn_k_norm.weight"))
    proc = train("--target", qwen2, "--prompts", trained_pair["prompts"], "-o", tmp_path / "out", *FAST)
    assert_refused(proc, "target-qwen2.gguf", "does not record the input of layer")
    assert not (tmp_path / "out").exists() and nothing_beside(tmp_path, ".out") == []


def test_a_prompt_file_with_nothing_usable(trained_pair, tmp_path):
    empty = tmp_path / "prompts.txt"
    empty.write_text("\n   \n\n")
    proc = train("--target", trained_pair["target"], "--prompts", empty, "-o", tmp_path / "out", *FAST)
    assert_refused(proc, "prompts.txt", "no prompts")
    assert not (tmp_path / "out").exists()


def test_an_init_drafter_of_another_width(trained_pair, tmp_path):
    smollm2_drafter = REPO / "tests" / "fixtures" / "smollm2" / "dflash"  # width 576, the target's is 256
    proc = train("--target", trained_pair["target"], "--prompts", trained_pair["prompts"], "-o", tmp_path / "out",
                 "--init", smollm2_drafter, *FAST)
    assert_refused(proc, "--init", "hidden_size is 576", "256")
    assert not (tmp_path / "out").exists()


def test_a_dflash2_shape_llama_cpp_refuses_is_refused_before_the_teacher(target_gguf, trained_pair, tmp_path):
    # the tiny target is 64 wide: DFlash 2's selector needs top_k*(top_k+1) = 72; once this took a
    # whole teacher pass and training before convert refused the result
    started = time.monotonic()
    proc = train("--target", target_gguf, "--prompts", trained_pair["prompts"], "-o", tmp_path / "out",
                 "--variant", "dflash2", *FAST)
    assert_refused(proc, "--variant dflash2", "hidden size 64 < selector_top_k*(selector_top_k+1) = 72",
                   "train --variant dflash")
    assert "teacher" not in proc.stderr and time.monotonic() - started < 60
    assert not (tmp_path / "out").exists()


def test_an_output_that_holds_something_else(trained_pair, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    for extra in ([], ["--force"]):
        proc = train("--target", trained_pair["target"], "--prompts", trained_pair["prompts"], "-o", out, *FAST, *extra)
        assert_refused(proc, str(out), "did not write")
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine\n"


@pytest.mark.parametrize("device", ["cuda", "mps"])
def test_a_torch_device_this_torch_cannot_reach(trained_pair, tmp_path, device):
    import torch

    if (torch.cuda.is_available() if device == "cuda" else torch.backends.mps.is_available()):
        pytest.skip(f"this torch reaches {device}")
    proc = train("--target", trained_pair["target"], "--prompts", trained_pair["prompts"], "-o", tmp_path / "out",
                 "--torch-device", device, *FAST)
    assert_refused(proc, f"--torch-device {device}", "--torch-device cpu")
    assert not (tmp_path / "out").exists() and nothing_beside(tmp_path, ".out") == []
