"""Every token proven on recurrent, hybrid and sliding-window targets, rollbacks and restores included.

On such targets llama-server splits the prompt to checkpoint before its end, keeps recurrent-state
snapshots to roll a step back (qwen35: Gated DeltaNet), or restores a checkpoint and verifies the
kept tokens again (qwen3next: no snapshots), and slides its window past old keys (gpt-oss). validate
replays all of it; under --exact every emitted token must be proven the target's argmax in a
bit-exact replay of its own verify batch, and a token substituted in the answer must be caught.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import dflash_gguf
from tests.validation.test_validate_flip import flipping_bin  # noqa: F401  (a fixture)

pytestmark = pytest.mark.integration


def _prompts(folder: Path, tmp_path: Path, n: int) -> Path:
    out = tmp_path / "prompts.txt"
    out.write_text("\n".join((folder / "prompts.txt").read_text().splitlines()[:n]) + "\n")
    return out


def _validate(folder: Path, prompts: Path, report: Path, *extra, **kwargs):
    proc = dflash_gguf("validate", "--target", folder / "target-F16.gguf", "--draft", folder / "dflash.gguf",
                       "--prompts", prompts, "-n", "32", "--threads", "1", "--report", report, *extra, **kwargs)
    return proc, json.loads(report.read_text())


@pytest.mark.parametrize("arch", ["qwen35", "qwen3next", "gpt-oss"])
def test_every_token_is_proven_by_replay_under_exact(arch, family, llama_bin, tmp_path):
    folder = family(arch)
    proc, report = _validate(folder, _prompts(folder, tmp_path, 3), tmp_path / "report.json", "--exact",
                             "--llama-bin", llama_bin)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["replay"]["exact"], report["replay"]
    assert report["proven_by_replay"] == report["produced"] > 0
    for prompt in report["prompts"]:
        assert prompt["proven_by_replay"] == prompt["produced"] and prompt["not_proven"] == []
    assert report["exact"]  # and identical to the target alone
    if arch == "qwen3next":  # no recurrent-state snapshots: rejected drafts went back through checkpoints
        assert report["replay"]["restores"] > 0
    assert f"proven by replay        {report['produced']} of {report['produced']} tokens" in proc.stdout


def test_a_substituted_token_after_restores_is_caught(family, flipping_bin, tmp_path):  # noqa: F811
    folder = family("qwen3next")
    record, prompts = tmp_path / "flip.json", tmp_path / "prompts.txt"
    # longer than the stand-in's warm-up bound (8 tokens), which it never alters
    prompts.write_text("Tell me a story about a robot who learns to paint, in three sentences.\n")
    proc, report = _validate(folder, prompts, tmp_path / "report.json", "--exact",
                             "--llama-bin", flipping_bin,
                             env={**os.environ, "DFLASH_TEST_FLIP_RECORD": str(record), "DFLASH_TEST_FLIP_ANY": "1"})
    flip = json.loads(record.read_text())
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert report["replay"]["restores"] > 0
    (prompt,) = report["prompts"]
    (missed,) = prompt["not_proven"]  # that token, and no other
    assert missed["position"] == flip["position"] and missed["why"].startswith("mismatch")
    assert report["proven_by_replay"] == report["produced"] - 1
    assert [d["position"] for d in report["divergences"] if d["kind"] == "mismatch"] == [flip["position"]]
