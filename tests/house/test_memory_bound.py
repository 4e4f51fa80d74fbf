"""benchmarks/memory_bound.py: inert FFN units widen the target without changing its tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.memory_bound import widen_ffn
from dflash_gguf.gguf.reader import GGUFFile
from tests.conftest import dflash_gguf
from training.fixtures.trained_gguf import trained_ggufs


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return trained_ggufs(tmp_path_factory.mktemp("trained"))


def test_widened_tensors_hold_the_original_and_zeros(trained, tmp_path):
    wide = widen_ffn(trained["target"], tmp_path / "wide.gguf", n_ff=1024)
    with GGUFFile(trained["target"]) as old, GGUFFile(wide) as new:
        assert new.get("qwen3.feed_forward_length") == 1024 and old.get("qwen3.feed_forward_length") == 768
        assert set(new.tensors) == set(old.tensors)
        for name, info in old.tensors.items():
            a = np.frombuffer(old.tensor_bytes(name), np.float16 if info.type == 1 else np.float32).reshape(info.shape).copy()
            b = np.frombuffer(new.tensor_bytes(name), np.float16 if info.type == 1 else np.float32).reshape(
                new.tensors[name].shape).copy()
            if ".ffn_" in name and name.endswith(("gate.weight", "up.weight", "down.weight")):
                kept = b[:a.shape[0], :a.shape[1]]
                assert b.shape == ((a.shape[0], 1024) if "down" in name else (1024, a.shape[1]))
                assert np.array_equal(kept, a)
                assert np.count_nonzero(b) == np.count_nonzero(a)  # everything added is zero
            else:
                assert np.array_equal(a, b), name


@pytest.mark.integration
def test_widened_target_decodes_the_originals_tokens_with_a_drafter(trained, llama_bin, tmp_path):
    wide = widen_ffn(trained["target"], tmp_path / "wide.gguf", n_ff=4096)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(trained["prompts"].read_text().splitlines(keepends=True)[:3]))
    out = tmp_path / "report.json"
    proc = dflash_gguf("validate", "--target", wide, "--draft", trained["dflash2"], "--baseline", trained["target"],
                       "--prompts", prompts, "-n", "64", "--backend", "cpu", "--report", out)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert not any(d["kind"] == "mismatch" for d in report["divergences"])
    assert report["accepted"] > 0
