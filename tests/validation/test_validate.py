"""`dflash-gguf validate` end to end on the real patched llama-server."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import cli, dflash_gguf
from tests.refusal import assert_refused

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
                        "-n", N, "--parallel", parallel, "--backend", "cpu", "--report", out)
    report = json.loads(out.read_text())
    kinds = {d["kind"] for d in report["divergences"]}
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "mismatch" not in kinds
    # the JSON's keys, as before the report was typed (validation/validate.py ValidationReport.to_dict)
    assert list(report) == ["exact", "lossless", "prompts", "mean_acceptance_length", "acceptance_rate", "drafted",
                            "accepted", "produced", "proven_by_replay", "positions_checked", "tokens_per_second",
                            "speedup", "speedup_unreliable", "speed", "divergences", "replay", "settings", "launch", "llama", "reference",
                            "drafting", "warnings", "finished_at"]
    assert len(report["prompts"]) == 3
    for p in report["prompts"]:
        assert list(p) == ["prompt", "exact", "lossless", "tokens", "produced", "positions_checked",
                           "proven_by_replay", "not_proven", "first_divergence", "numerical", "mismatches",
                           "draft_n", "draft_n_accepted"]
        assert p["tokens"] == int(N)
        assert p["positions_checked"] == p["produced"] == int(N)  # every emitted token checked
    assert report["positions_checked"] == report["produced"] == 3 * int(N)
    assert report["drafted"] > 0, "the drafter never drafted"
    assert report["mean_acceptance_length"] >= 1.0 and 0.0 <= report["acceptance_rate"] <= 1.0
    assert report["tokens_per_second"]["target"] > 0 and report["tokens_per_second"]["speculative"] > 0
    assert report["llama"]["backend"] == "cpu" and report["settings"]["parallel"] == int(parallel)
    assert report["lossless"] and report["replay"]["exact"], report["replay"]
    assert report["replay"]["alone_tokens_reproduced"] == report["replay"]["alone_tokens"]
    assert "lossless                yes" in proc.stdout


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
    # --exact: a quantized target's default kernels include AMX on CPUs that report it, which traps
    # (SIGILL / SIGSEGV at start-up) in VMs that do not enable its tiles; --no-repack leaves them out
    proc = run_validate("--target", coarse_target, "--draft", converted["dflash-b16"], "--baseline", target_gguf,
                        "--prompts", prompts_file, "-n", N, "--backend", "cpu", "--exact", "--report", out)
    report = json.loads(out.read_text())
    assert proc.returncode == 1, proc.stderr
    assert not report["exact"]
    mismatches = [d for d in report["divergences"] if d["kind"] == "mismatch"]
    assert mismatches and all(d["speculative_token"] != d["target_token"] for d in mismatches)
    assert all(d["margin"] > report["replay"]["tolerance"] for d in mismatches)
    assert not report["lossless"]
    # every token is checked, not only the first divergence: prompts hold several mismatches each
    for prompt in report["prompts"]:
        assert prompt["mismatches"] == sum(d["prompt"] == prompt["prompt"] for d in mismatches)
    assert max(p["mismatches"] for p in report["prompts"]) > 1
    assert report["positions_checked"] == report["produced"]
    assert "mismatch" in proc.stdout


def test_reference_parity(fixtures, converted, target_gguf, prompts_file, tmp_path):
    out = tmp_path / "report.json"
    proc = run_validate("--target", target_gguf, "--draft", converted["dflash2-b8"], "--prompts", prompts_file,
                        "-n", N, "--backend", "cpu", "--reference-draft", fixtures / "dflash2-b8",
                        "--reference-target", fixtures / "target-hf", "--report", out)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    ref = report["reference"]
    assert len(ref["prompts"]) == 3 and all(p["tokens"] == int(N) for p in ref["prompts"])
    # random weights accept nothing on either side: tau is 1.0 in both
    assert ref["mean_acceptance_length"] == pytest.approx(report["mean_acceptance_length"], abs=0.05)
    assert "reference (PyTorch)" in proc.stdout


@pytest.mark.parametrize("args, needle", [
    (["--reference-draft", "."], "go together"),
])
def test_bad_input_exits_2(args, needle, converted, target_gguf):
    assert_refused(cli("validate", "--target", target_gguf, "--draft", converted["dflash-b16"], *args), needle)


def test_empty_prompts_file_exits_2(converted, target_gguf, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    assert_refused(cli("validate", "--target", target_gguf, "--draft", converted["dflash-b16"], "--prompts", empty),
                   "no prompts")


def _serve_command(target_gguf, draft, *server_args) -> list[str]:
    """The command line `serve` gives its llama-server (read from /proc while it runs)."""
    import signal
    import sys

    from tests.conftest import REPO
    from tests.runner.test_server import _read_line, children_named

    proc = subprocess.Popen([sys.executable, "-m", "dflash_gguf.cli", "serve", "--target", str(target_gguf),
                             "--draft", str(draft), "--backend", "cpu", "--", *server_args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        _read_line(proc, 120)
        (child,) = children_named(proc.pid, "llama-server")
        with open(f"/proc/{child}/cmdline", "rb") as fh:
            return [a.decode() for a in fh.read().split(b"\0") if a]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def _without(command: list[str], flag: str, n: int) -> list[str]:
    """The command without `flag` and the n-1 words after it."""
    i = command.index(flag)
    return command[:i] + command[i + n:]


def _without_port(command: list[str]) -> list[str]:
    return _without(command, "--port", 2)


def test_validate_runs_the_command_serve_runs(converted, target_gguf, prompts_file, tmp_path):
    """What validate certifies is serve's launch with the user's arguments; here they set the
    context, so validate adds only the server's step log (-lv 5), and -np / --spec-draft-n-max are
    read by the runner."""
    draft = converted["dflash-b16"]
    user = ["-c", "1024", "-t", "1", "-np", "2", "--spec-draft-n-max", "8"]  # -t 2 beside another worker: 122 s
    served = _serve_command(target_gguf, draft, *user)
    out = tmp_path / "report.json"
    proc = run_validate("--target", target_gguf, "--draft", draft, "--prompts", prompts_file, "-n", N,
                        "--backend", "cpu", "--report", out, "--", *user)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    launch = report["launch"]
    assert _without(_without_port(launch["speculative_command"]), "-lv", 2) == _without_port(served)
    assert launch["added"] == ["-lv", "5"] and launch["user_args"] == ["-c", "1024", "-t", "1"]
    assert served.count("--spec-draft-n-max") == 1 and served[served.index("--spec-draft-n-max") + 1] == "8"
    assert served[served.index("--parallel") + 1] == "2" and report["settings"]["parallel"] == 2
    assert report["settings"]["draft_max"] == 8
    # the target alone runs the same launch without the drafter's -md/--spec-type/--spec-draft-n-max
    assert _without(_without_port(launch["target_command"]), "-lv", 2) == _without(_without_port(served), "-md", 6)
    assert "your arguments        -c 1024 -t 1" in proc.stdout


def test_validate_says_what_it_adds_for_measuring(converted, target_gguf, prompts_file, tmp_path):
    out = tmp_path / "report.json"
    proc = run_validate("--target", target_gguf, "--draft", converted["dflash2-b8"], "--prompts", prompts_file,
                        "-n", N, "--backend", "cpu", "--report", out, "--json")
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)  # --json is a flag: the report on stdout
    assert printed == json.loads(out.read_text())
    launch = printed["launch"]
    assert launch["added"][0] == "-c" and launch["user_args"] == []
    assert launch["recipe"][-3:] == ["--metrics", "--parallel", "1"]
    command = launch["speculative_command"]
    assert command[command.index("--port") + 2:] == launch["recipe"] + launch["added"]
