"""`dflash-gguf validate` on every published family (tests/fixtures/published_drafters.py): with each
drafter the patched llama-server drafts, and the output stays exactly the target's alone (greedy), so
speculative decoding with them is lossless. The untrained fixtures are not expected to be accepted.
"""

from __future__ import annotations

import json
import pytest

from tests.conftest import dflash_gguf
from tests.fixtures.published_drafters import cached_published

pytestmark = pytest.mark.integration

FAMILIES = ["fp8-channel", "fp8-block", "sinks", "mimo", "gpt-oss-bias", "dspark-lineage", "dspark-eagle3"]
PROMPTS = "The capital of France is\ndef add(a, b):\\n    return\nQuestion: 2 + 2 =\n"


@pytest.mark.parametrize("family", FAMILIES)
def test_lossless_with_every_published_family(family, target_gguf, llama_bin, tmp_path):
    published = cached_published()
    drafter = tmp_path / f"{family}.gguf"
    proc = dflash_gguf("convert", published / family, "--target", target_gguf, "-o", drafter)
    assert proc.returncode == 0, proc.stderr
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPTS)
    report_path = tmp_path / "report.json"
    proc = dflash_gguf("validate", "--target", target_gguf, "--draft", drafter, "--prompts", prompts, "-n", "16",
                       "--parallel", "1", "--backend", "cpu", "--report", report_path)
    assert proc.returncode == 0, (proc.stdout, proc.stderr[-2000:])
    report = json.loads(report_path.read_text())
    assert "mismatch" not in {d["kind"] for d in report["divergences"]}
    assert all(p["tokens"] == 16 for p in report["prompts"])
    assert report["drafted"] > 0, "the drafter never drafted"
