"""`describe()`: one reading of a drafter GGUF, and every command that needs one agrees with it."""

from __future__ import annotations

import json

import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType

from dflash_gguf.gguf.describe import describe
from dflash_gguf.gguf.format import KV, TensorInfo
from dflash_gguf.gguf.reader import GGUFFile
from dflash_gguf.gguf.writer import GGUFPlan, PlannedTensor, write_gguf
from dflash_gguf.runner.launch import speculative_args
from tests.conftest import dflash_gguf
from tests.refusal import assert_refused
from tests.legacy_fixture import make_legacy


def rewrite(src, dst, drop_keys=(), add_kv=(), add_tensors=()):
    """A copy of a GGUF without some keys, with more keys and more (zero-filled F32) tensors."""
    with GGUFFile(src) as f:
        plan = GGUFPlan()
        plan.add_kv([kv for k, kv in f.kv.items() if k not in drop_keys] + list(add_kv))
        for name, info in f.tensors.items():
            data = bytes(f.tensor_bytes(name))
            plan.tensors.append(PlannedTensor(TensorInfo(name, info.shape, info.type), lambda d=data: [d]))
        for name, shape in add_tensors:
            data = bytes(4 * shape[0] * shape[1])
            plan.tensors.append(PlannedTensor(TensorInfo(name, shape, QT.F32), lambda d=data: [d]))
        write_gguf(plan, dst)
    return dst


def inspect_json(path) -> dict:
    proc = dflash_gguf("inspect", path, "--json")
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def test_dflash_and_dflash2(converted):
    d = describe(converted["dflash-b16"])
    assert (d.variant_name, d.spec_type, d.block_size, d.block_size_in_file, d.draft_length) == \
        ("DFlash", "draft-dflash", 16, True, 15)
    assert (d.target_layers_hf, d.target_layers_llama) == ((0, 2, 4), (1, 3, 5))
    assert (d.mask_token_id, d.vocab_size, d.hidden, d.conv_group_size) == (151669, 151936, 64, None)
    assert d.problems == []
    d2 = describe(converted["dflash2-b8"])
    assert (d2.variant_name, d2.spec_type, d2.block_size, d2.draft_length) == ("DFlash 2", "draft-dflash", 8, 7)
    assert d2.conv_group_size is not None and d2.selector_top_k is not None and d2.problems == []
    assert [t.name for t in d2.tensors if t.name.startswith("selector_")]


def test_legacy_is_described_in_hf_numbering_and_not_runnable(converted, tmp_path):
    legacy = make_legacy(converted["dflash-b16"], tmp_path / "legacy.gguf")
    d = describe(legacy)
    assert (d.variant_name, d.spec_type, d.block_size) == ("legacy fork", None, 16)
    assert (d.target_layers_hf, d.target_layers_llama) == ((0, 2, 4), (1, 3, 5))
    with pytest.raises(Exception, match="legacy fork layout"):
        d.require_runnable()


@pytest.mark.parametrize("anchor, length", [(None, 16), (True, 16), (False, 15)])
def test_dspark_draft_length_is_the_servers(converted, tmp_path, anchor, length):
    """Anchor-first DSpark drafts a whole block (common/speculative.cpp); inspect says what the
    server is told, from the same description."""
    extra = [KV("dflash.sample_from_anchor", GGUFValueType.BOOL, anchor)] if anchor is not None else []
    dspark = rewrite(converted["dflash-b16"], tmp_path / "dspark.gguf", add_kv=extra,
                     add_tensors=[("markov_w1.weight", (64, 64))])
    report = inspect_json(dspark)
    assert (report["variant"], report["spec_type"], report["block_size"], report["draft_length"]) == \
        ("DSpark", "draft-dspark", 16, length)
    assert speculative_args(dspark)[-4:] == ["--spec-type", "draft-dspark", "--spec-draft-n-max", str(length)]


def test_default_block_size_is_llama_cpps_everywhere(converted, tmp_path):
    """Without dflash.block_size llama.cpp uses 16: inspect, the server flags and quantize agree."""
    bare = rewrite(converted["dflash2-b8"], tmp_path / "no-block.gguf", drop_keys=("dflash.block_size",))
    report = inspect_json(bare)
    assert (report["block_size"], report["block_size_in_file"], report["draft_length"]) == (16, False, 15)
    assert speculative_args(bare)[-1] == "15"
    proc = dflash_gguf("inspect", bare)
    assert "llama.cpp's default" in proc.stdout


def test_wrong_value_types_are_problems_not_crashes(converted, tmp_path):
    odd = rewrite(converted["dflash-b16"], tmp_path / "odd.gguf", drop_keys=("dflash.block_size",),
                  add_kv=[KV("dflash.block_size", GGUFValueType.STRING, "sixteen")])
    report = inspect_json(odd)
    assert report["block_size"] == 16 and any("dflash.block_size is 'sixteen'" in p for p in report["problems"])


def test_quantize_refuses_what_the_server_refuses(converted, llama_bin, tmp_path):
    """quantize checks its input with the same description as the runner: same message."""
    legacy = make_legacy(converted["dflash-b16"], tmp_path / "legacy.gguf")
    proc = dflash_gguf("quantize", legacy, tmp_path / "q.gguf", "--type", "Q8_0", "--llama-bin", llama_bin)
    assert_refused(proc, out=tmp_path / "q.gguf")
    with pytest.raises(Exception) as err:
        speculative_args(legacy)
    assert str(err.value) in proc.stderr
