"""Every malformed input: exit status 2, one line on stderr naming the problem, no traceback, and no
output file (nor a temporary one) left behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType as T

from tests.conftest import cli
from tests.refusal import assert_refused
from tests.malformed import (copy_file, edit_config, edit_tensors, encode, rebuild_gguf, regenerate_weights,
                             truncate, write_config)


def repeat_key(path: Path, pair: str) -> Path:
    """Put `pair` ("key": value) first in the file's top-level object, beside the key it repeats."""
    text = path.read_text()
    assert text.startswith("{") and pair.split(":")[0] in text
    path.write_text("{" + pair + ", " + text[1:])
    return path.parent


def write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path.parent


# (drafter fixture, how to break it, words the one-line message must contain)
CASES = {
    "unknown-architecture": ("dflash-b16", lambda d: edit_config(d, architectures=["LlamaForCausalLM"]),
                             ["architectures", "LlamaForCausalLM"]),
    "missing-fc": ("dflash-b16", lambda d: edit_tensors(d, drop=("fc.weight",)), ["missing tensor", "fc.weight"]),
    "unexpected-tensor": ("dflash-b16",
                          lambda d: edit_tensors(d, add={"lm_head.weight": np.zeros((4, 64), np.float16)}),
                          ["unexpected tensor", "lm_head.weight"]),
    "conv-pair-half": ("dflash2-b8", lambda d: edit_config(d, dflash__conv_group_size=None),
                       ["conv_kernel_size", "conv_group_size"]),
    "selector-pair-half": ("dflash2-b8", lambda d: edit_config(d, dflash__selector_rank=None),
                           ["selector_top_k", "selector_rank"]),
    "mask-outside-vocab": ("dflash-b16", lambda d: edit_config(d, dflash__mask_token_id=151936),
                           ["mask_token_id 151936", "outside the vocabulary"]),
    "layer-beyond-target": ("dflash-b16", lambda d: edit_config(d, dflash__target_layer_ids=[0, 2, 6]),
                            ["target_layer_ids [6]", "6 layers"]),
    "hidden-size-mismatch": ("dflash-b16", lambda d: regenerate_weights(edit_config(d, hidden_size=128)),
                             ["hidden size 128", "embedding length 64"]),
    "vocab-mismatch": ("dflash-b16", lambda d: edit_config(d, vocab_size=152064),
                       ["vocabulary size 152064", "151936"]),
    "dflash2-group-not-dividing": ("dflash2-b8", lambda d: regenerate_weights(edit_config(d, dflash__conv_group_size=24)),
                                   ["conv_group_size 24", "multiple"]),
    "dflash2-top-k-too-big": ("dflash2-b8", lambda d: regenerate_weights(edit_config(d, dflash__selector_top_k=8)),
                              ["selector_top_k", "72"]),
    "truncated-safetensors": ("dflash-b16", lambda d: (truncate(d / "model.safetensors"), d)[1],
                              ["model.safetensors", "truncated"]),
    "corrupt-safetensors": ("dflash-b16", lambda d: ((d / "model.safetensors").write_bytes(b"\x10\0\0\0\0\0\0\0{not json!!}...."), d)[1],
                            ["model.safetensors", "corrupt"]),
    "missing-shard": ("dflash-sharded", lambda d: ((d / "weights-part-b.safetensors").unlink(), d)[1],
                      ["weights-part-b.safetensors"]),
    "wrong-shape": ("dflash-b16", lambda d: edit_tensors(d, add={"norm.weight": np.ones(32, np.float16)}),
                    ["norm.weight", "[32]", "[64]"]),
    # a card, license or config that is not UTF-8 is refused, never read as empty (hiding its license)
    "card-utf16": ("dflash-b16", lambda d: write_bytes(d / "README.md", "---\nlicense: cc-by-nd-4.0\n---\n".encode("utf-16")),
                   ["README.md", "not UTF-8", "save it as UTF-8"]),
    "license-utf16": ("dflash-b16", lambda d: write_bytes(d / "LICENSE", "CC BY-ND 4.0\n".encode("utf-16-le")),
                      ["LICENSE", "not UTF-8", "save it as UTF-8"]),
    "config-utf16": ("dflash-b16", lambda d: write_bytes(d / "config.json", (d / "config.json").read_text().encode("utf-16")),
                     ["config.json", "not UTF-8", "save it as UTF-8"]),
    # a repeated key is refused, not resolved to its last value
    "config-duplicate-key": ("dflash-b16", lambda d: repeat_key(d / "config.json", '"vocab_size": 152064'),
                             ["config.json", "'vocab_size' appears twice"]),
    "index-duplicate-key": ("dflash-sharded", lambda d: repeat_key(d / "model.safetensors.index.json",
                                                                   '"metadata": {}'),
                            ["model.safetensors.index.json", "'metadata' appears twice"]),
    # a sliding window with no size, or a layer kind llama.cpp does not run, is not full attention
    "swa-without-window": ("dflash-swa", lambda d: edit_config(d, sliding_window=None),
                           ["config.json", "'use_sliding_window' is true", "sliding_window", "set 'use_sliding_window' to false"]),
    "swa-null-window": ("dflash-swa", lambda d: write_config(d, {**json.loads((d / "config.json").read_text()),
                                                                  "sliding_window": None}),
                        ["config.json", "'use_sliding_window' is true", "sliding_window"]),
    "unknown-layer-type": ("dflash-swa", lambda d: edit_config(d, layer_types=["sliding_attention", "chunked_attention",
                                                                               "full_attention"]),
                           ["config.json", "'layer_types[1]'", "chunked_attention", "full_attention, sliding_attention"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refuses_broken_drafter(case, drafter_copy, target_gguf, tmp_path):
    fixture, breaker, needles = CASES[case]
    drafter = breaker(drafter_copy(fixture))
    out = tmp_path / "out" / "drafter.gguf"
    out.parent.mkdir()
    assert_refused(cli("convert", drafter, "--target", target_gguf, "-o", out), *needles, out=out)


@pytest.mark.parametrize("target_kind", ["gguf", "hf"])
def test_refuses_broken_target(target_kind, fixtures, target_gguf, tmp_path):
    if target_kind == "gguf":
        target = truncate(copy_file(target_gguf, tmp_path), 0.3)
        needles = ["truncated"]
    else:
        target = tmp_path / "target-hf"
        target.mkdir()
        copy_file(fixtures / "target-hf" / "config.json", target)
        needles = ["tokenizer.json", "not found"]
    out = tmp_path / "drafter.gguf"
    assert_refused(cli("convert", fixtures / "dflash-b16", "--target", target, "-o", out), *needles, out=out)


@pytest.mark.parametrize("key, value", [("qwen3.block_count", 1 << 63), ("qwen3.block_count", 1 << 32),
                                        ("qwen3.embedding_length", 1 << 40), ("qwen3.vocab_size", 1 << 62)])
def test_refuses_absurd_target_gguf_facts(key, value, fixtures, target_gguf, tmp_path):
    """A target's counts are held to the ranges of the config.json fields they come from."""
    target = rebuild_gguf(target_gguf, tmp_path / "target.gguf",
                          kv=lambda kvs: [(k, v) for k, v in kvs if k != key] + [(key, encode(T.UINT64, value))])
    out = tmp_path / "drafter.gguf"
    assert_refused(cli("convert", fixtures / "dflash-b16", "--target", target, "-o", out),
                   "target.gguf", repr(key), str(value), out=out)


def test_refuses_truncated_legacy_gguf(target_gguf, tmp_path):
    broken = truncate(copy_file(target_gguf, tmp_path), 0.5)
    out = tmp_path / "migrated.gguf"
    assert_refused(cli("convert", broken, "-o", out), "truncated", out=out)


def test_refuses_non_legacy_gguf_as_source(target_gguf, tmp_path):
    out = tmp_path / "migrated.gguf"
    assert_refused(cli("convert", target_gguf, "-o", out), "qwen3", "legacy", out=out)


def test_warns_when_mask_token_is_pad(drafter_copy, target_gguf, tmp_path):
    drafter = edit_config(drafter_copy("dflash-b16"), dflash__mask_token_id=151643)  # <|endoftext|> = pad
    out = tmp_path / "drafter.gguf"
    proc = cli("convert", drafter, "--target", target_gguf, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "warning:" in proc.stderr and "padding token" in proc.stderr
    assert proc.stderr.count("padding token") == 1, proc.stderr  # said once, not logged and printed
    assert out.is_file()


def test_existing_output_needs_force(fixtures, target_gguf, tmp_path):
    out = tmp_path / "drafter.gguf"
    out.write_bytes(b"keep me")
    assert_refused_keep = cli("convert", fixtures / "dflash-b16", "--target", target_gguf, "-o", out)
    assert assert_refused_keep.returncode == 2 and "--force" in assert_refused_keep.stderr
    assert out.read_bytes() == b"keep me"


@pytest.mark.parametrize("command", ["convert", "quantize"])
def test_output_ending_in_a_separator_is_refused(command, fixtures, target_gguf, tmp_path):
    """`-o newdir/` names a folder: refused, never written as a file called newdir."""
    out = tmp_path / "newdir"
    args = (["convert", fixtures / "dflash-b16", "--target", target_gguf, "-o", f"{out}/"] if command == "convert"
            else ["quantize", target_gguf, f"{out}/"])
    assert_refused(cli(*args), "ends with a separator", "give a file name", out=out)
