"""`dflash-gguf validate` end to end on the real patched llama-server."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import dflash_gguf

pytestmark = pytest.mark.integration

PROMPTS = "def add(a, b):\\n    return\nThe capital of France is\nQuestion: 2 + 2 =\n"
N = "16"


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text(PROMPTS)
    return path


def run_validate(*args):
    return dflash_gguf("validate", *args)


@pytest.mark.parametrize("parallel", ["1", "4"])
@pytest.mark.parametrize("drafter", ["dflash-b16", "dflash-swa", "dflash2-b8"])
def test_exact_for_every_variant(drafter, parallel, converted, target_gguf, prompts_file, llama_bin, tmp_path):
    out = tmp_path / "report.json"
    proc = run_validate("--target", target_gguf, "--draft", converted[drafter], "--prompts", prompts_file,
                        "-n", N, "--parallel", parallel, "--backend", "cpu", "--json", out)
    report = json.loads(out.read_text())
    kinds = {d["kind"] for d in report["divergences"]}
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "mismatch" not in kinds
    assert set(report) >= {"exact", "prompts", "mean_acceptance_length", "acceptance_rate", "tokens_per_second",
                           "speedup", "divergences", "llama"}
    assert len(report["prompts"]) == 3
    for p in report["prompts"]:
        assert set(p) >= {"prompt", "exact", "tokens", "first_divergence"}
        assert p["tokens"] == int(N)
    assert report["drafted"] > 0, "the drafter never drafted"
    assert report["mean_acceptance_length"] >= 1.0 and 0.0 <= report["acceptance_rate"] <= 1.0
    assert report["tokens_per_second"]["target"] > 0 and report["tokens_per_second"]["speculative"] > 0
    assert report["llama"]["backend"] == "cpu" and report["settings"]["parallel"] == int(parallel)
    assert "exact output" in proc.stdout


@pytest.fixture(scope="module")
def coarse_target(target_gguf, llama_bin, tmp_path_factory):
    """A Q4_0 copy of the target: speculative decoding on it is NOT the F16 target's output."""
    from dflash_gguf.runner.build import runtime_env

    out = tmp_path_factory.mktemp("q4") / "target-Q4_0.gguf"
    subprocess.run([str(llama_bin / "llama-quantize"), str(target_gguf), str(out), "Q4_0"], check=True,
                   capture_output=True, env=runtime_env(llama_bin))
    return out


def test_a_run_that_is_not_lossless_fails_with_a_mismatch(converted, target_gguf, coarse_target, prompts_file,
                                                         tmp_path):
    out = tmp_path / "report.json"
    proc = run_validate("--target", coarse_target, "--draft", converted["dflash-b16"], "--baseline", target_gguf,
                        "--prompts", prompts_file, "-n", N, "--backend", "cpu", "--json", out)
    report = json.loads(out.read_text())
    assert proc.returncode == 1, proc.stderr
    assert not report["exact"]
    mismatches = [d for d in report["divergences"] if d["kind"] == "mismatch"]
    assert mismatches and all(d["speculative_token"] != d["target_token"] for d in mismatches)
    assert "mismatch" in proc.stdout


def test_reference_parity(fixtures, converted, target_gguf, prompts_file, tmp_path):
    out = tmp_path / "report.json"
    proc = run_validate("--target", target_gguf, "--draft", converted["dflash2-b8"], "--prompts", prompts_file,
                        "-n", N, "--backend", "cpu", "--reference-draft", fixtures / "dflash2-b8",
                        "--reference-target", fixtures / "target-hf", "--json", out)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    ref = report["reference"]
    assert len(ref["prompts"]) == 3 and all(p["tokens"] == int(N) for p in ref["prompts"])
    # random weights accept nothing on either side: tau is 1.0 in both
    assert ref["mean_acceptance_length"] == pytest.approx(report["mean_acceptance_length"], abs=0.05)
    assert "reference (PyTorch)" in proc.stdout


@pytest.mark.parametrize("args, needle", [
    (["--temperature", "0.7"], "greedy"),
    (["--reference-draft", "."], "go together"),
])
def test_bad_input_exits_2(args, needle, converted, target_gguf):
    proc = run_validate("--target", target_gguf, "--draft", converted["dflash-b16"], *args)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr


def test_empty_prompts_file_exits_2(converted, target_gguf, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    proc = run_validate("--target", target_gguf, "--draft", converted["dflash-b16"], "--prompts", empty)
    assert proc.returncode == 2 and "no prompts" in proc.stderr
