"""`dflash-gguf inspect` on converted, legacy and damaged drafter files."""

from __future__ import annotations

import json


from dflash_gguf.gguf.format import TensorInfo
from dflash_gguf.gguf.reader import GGUFFile
from dflash_gguf.gguf.writer import GGUFPlan, PlannedTensor, write_gguf
from tests.conftest import cli
from tests.refusal import assert_refused
from tests.legacy_fixture import make_legacy


def inspect_json(path):
    proc = cli("inspect", path, "--json")
    return proc.returncode, json.loads(proc.stdout)


def test_dflash_report(converted):
    rc, r = inspect_json(converted["dflash-b16"])
    assert rc == 0 and r["problems"] == []
    assert r["variant"] == "DFlash" and r["block_size"] == 16 and r["draft_length"] == 15
    assert r["target_layers"] == {"hf": [0, 2, 4], "llama_cpp": [1, 3, 5]}
    assert r["mask_token_id"] == 151669 and r["vocab_size"] == 151936
    types = {t["name"]: t["type"] for t in r["tensors"]}
    assert types["fc.weight"] == "BF16" and types["blk.0.attn_norm.weight"] == "F32"


def test_dflash2_and_sliding_window_reports(converted):
    rc, r = inspect_json(converted["dflash2-b8"])
    assert rc == 0 and r["variant"] == "DFlash 2" and r["draft_length"] == 7
    rc, r = inspect_json(converted["dflash-swa"])
    assert rc == 0 and r["sliding_window"] and any(r["sliding_window_pattern"])


def test_legacy_file_is_flagged(converted, tmp_path):
    legacy = make_legacy(converted["dflash-b16"], tmp_path / "legacy.gguf")
    rc, r = inspect_json(legacy)
    assert rc == 1 and r["variant"] == "legacy fork"
    assert r["target_layers"] == {"hf": [0, 2, 4], "llama_cpp": [1, 3, 5]}
    assert any("legacy" in p for p in r["problems"])


def _rewrite_without(src, dst, drop_keys=(), drop_tensors=()):
    with GGUFFile(src) as f:
        plan = GGUFPlan()
        plan.add_kv([kv for k, kv in f.kv.items() if k not in drop_keys])
        for name, info in f.tensors.items():
            if name not in drop_tensors:
                data = bytes(f.tensor_bytes(name))
                plan.tensors.append(PlannedTensor(TensorInfo(name, info.shape, info.type), lambda d=data: [d]))
        write_gguf(plan, dst)
    return dst


def test_window_metadata_and_missing_pieces_are_problems(converted, tmp_path):
    broken = _rewrite_without(converted["dflash-swa"], tmp_path / "old-swa.gguf",
                              drop_keys=("dflash.attention.sliding_window", "dflash.target_layers"),
                              drop_tensors=("fc.weight",))
    proc = cli("inspect", broken)
    assert proc.returncode == 1
    assert "sliding-window layers without the window metadata" in proc.stdout
    assert "missing key dflash.target_layers" in proc.stdout
    assert "fc.weight" in proc.stdout


def test_truncated_file_is_an_error(converted, tmp_path):
    data = converted["dflash-b16"].read_bytes()
    broken = tmp_path / "cut.gguf"
    broken.write_bytes(data[: len(data) // 3])
    proc = cli("inspect", broken)
    assert_refused(proc, "truncated")
