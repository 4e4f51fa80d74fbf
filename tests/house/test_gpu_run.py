"""benchmarks/gpu.sh refuses what it cannot do before it starts anything (the run itself is a
benchmark: `benchmarks/gpu.sh --cpu` here, the whole script on a GPU machine)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "gpu.sh"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_unknown_arguments_are_refused_with_the_usage():
    proc = run("--fast")
    assert proc.returncode == 2 and "unknown argument --fast" in proc.stderr
    usage = run("--help")
    assert usage.returncode == 0 and "--cpu" in usage.stdout and "docs/benchmarks-cuda.md" in usage.stdout


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU is here: the script would run")
def test_without_a_gpu_the_cuda_run_says_so_and_points_at_cpu():
    proc = run()
    assert proc.returncode == 2 and "no NVIDIA GPU here" in proc.stderr and "--cpu" in proc.stderr


def test_the_train_section_trains_a_lossless_drafter_and_says_what_it_cost(trained_pair, llama_bin):
    """gpu.sh's train section, short: the real `dflash-gguf train` on the trained pair's target (the
    teacher on the patched build, torch on what it sees), its summary on the page."""
    pytest.importorskip("torch")
    import argparse

    from benchmarks.gpu_run import train_section, train_text

    args = argparse.Namespace(train_steps=20, n_predict=16, prompts=2, backend="cpu", llama_bin=llama_bin,
                              train_threads=1)
    result = train_section(trained_pair, args)
    assert result["steps"] == 20 and result["prompts"] == 200 and result["device"] == "cpu", result
    assert result["held_out"]["lossless"] and result["held_out"]["prompts"] == 2, result
    page = "\n".join(train_text(result))
    assert "`dflash-gguf train --variant dflash --steps 20`" in page and "lossless: yes" in page
