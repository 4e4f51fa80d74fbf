"""Power: a speculative path that really changes a token is caught as a mismatch, not excused.

A stand-in llama-server (tests/validation/flipping_server.py, a real HTTP server in front of the real one)
replaces one token the target accepted from the drafter by another id in its answer. validate
must find that very token, as a mismatch against the target's own choice in the verify batch that
produced it, and exit 1; the rest of the run stays proven."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, dflash_gguf

pytestmark = pytest.mark.integration


@pytest.fixture
def flipping_bin(llama_bin: Path, tmp_path: Path) -> Path:
    """A bin folder whose llama-server is the stand-in; every other file links to the real build's."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for item in llama_bin.iterdir():
        if item.name != "llama-server":
            (folder / item.name).symlink_to(item)
    script = folder / "llama-server"
    script.write_text(f"#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m tests.validation.flipping_server "
                      f"{llama_bin / 'llama-server'} \"$@\"\n")
    script.chmod(0o755)
    return folder


def test_a_flipped_accepted_draft_is_a_mismatch(trained_pair, flipping_bin, tmp_path):
    prompts = tmp_path / "prompts.txt"
    lines = trained_pair["prompts"].read_text().splitlines()
    prompts.write_text("\n".join(lines[:2]) + "\n")
    record, out = tmp_path / "flip.json", tmp_path / "report.json"
    proc = dflash_gguf("validate", "--target", trained_pair["target"], "--draft", trained_pair["dflash"],
                       "--prompts", prompts, "-n", "32", "--llama-bin", flipping_bin, "--threads", "1",
                       "--report", out, env={**os.environ, "DFLASH_TEST_FLIP_RECORD": str(record)})
    flip = json.loads(record.read_text())
    report = json.loads(out.read_text())
    assert proc.returncode == 1, proc.stderr
    assert flip["position"] in flip["accepted_positions"]  # the stand-in altered an accepted draft
    mismatches = [d for d in report["divergences"] if d["kind"] == "mismatch"]
    assert [d["position"] for d in mismatches] == [flip["position"]], report["divergences"]
    (m,) = mismatches
    assert m["width"] > 1 and m["margin"] > report["replay"]["tolerance"]
    assert m["speculative_token"] == m["target_token"] + 1  # the stand-in's id, against the target's own
    assert not report["lossless"] and report["replay"]["exact"]
    assert report["positions_checked"] == report["produced"]
    assert "lossless                no: 1 token(s)" in proc.stdout
