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
