"""`make setup`: a failing step stops make and leaves no stamp, so the next `make` retries."""

from __future__ import annotations

import subprocess

from tests.conftest import REPO


def _make_setup(tmp_path, fail_on: str) -> subprocess.CompletedProcess:
    # a pip that records its calls and fails on the step named by `fail_on`
    pip = tmp_path / "pip"
    pip.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\ncase "$*" in *"{fail_on}"*) exit 1;; esac\n')
    pip.chmod(0o755)
    return subprocess.run(["make", "-C", str(REPO), "setup", f"VENV={tmp_path}/venv", f"PIP={pip}"],
                          capture_output=True, text=True, timeout=300)


def test_a_failed_setup_step_fails_make_and_leaves_no_stamp(tmp_path):
    failed = _make_setup(tmp_path, fail_on="-e .[test,train]")
    assert failed.returncode != 0
    assert not (tmp_path / "venv" / ".installed").exists()
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[-1].startswith("install -q -e")  # nothing ran after the failing step

    retried = _make_setup(tmp_path, fail_on="never")
    assert retried.returncode == 0, retried.stderr
    assert (tmp_path / "venv" / ".installed").exists()
    assert (tmp_path / "calls").read_text().count("install -q -e") == 2
