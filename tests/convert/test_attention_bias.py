"""Attention biases (z-lab gpt-oss-*-DFlash: attention_bias true): the converter writes
blk.N.attn_{q,k,v,output}.bias as the pinned converter does, and with ggml_patches/0004 the patched
llama.cpp loads and applies them: the first draft is the z-lab reference's, token for token.

Against a build without 0004 (DFLASH_GGUF_TEST_LLAMA_BIN=<unpatched bin>) the integration tests fail:
the drafter does not load ("done_getting_tensors: wrong number of tensors; expected 33, got 25").
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from dflash_gguf.gguf.reader import GGUFFile
from tests.conftest import dflash_gguf
from tests.fixtures.published_drafters import cached_published
from training.fixtures.gguf_compare import differences
from tests.refusal import assert_refused

BIASES = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias")


@pytest.fixture(scope="session")
def published() -> Path:
    return cached_published()


@pytest.mark.upstream
@pytest.mark.parametrize("outtype", ["f32", "bf16", "q8_0"])
def test_matches_upstream(outtype, published, fixtures, tmp_path):
    from training.fixtures.upstream import run_upstream_converter

    theirs = run_upstream_converter(published / "gpt-oss-bias", tmp_path / "theirs.gguf", outtype, fixtures / "target-hf")
    ours = tmp_path / "ours.gguf"
    proc = dflash_gguf("convert", published / "gpt-oss-bias", "--target", fixtures / "target-hf", "-o", ours,
                       "--outtype", outtype)
    assert proc.returncode == 0, proc.stderr
    assert differences(ours, theirs) == []
    with GGUFFile(ours) as f:
        for i in range(2):
            for bias in BIASES:
                assert f.tensors[f"blk.{i}.{bias}"].type.name == "F32"


def _drop(folder: Path, name: str) -> Path:
    tensors = load_file(folder / "model.safetensors")
    del tensors[name]
    save_file(tensors, folder / "model.safetensors")
    return folder


def _config(folder: Path, **changes) -> Path:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


BROKEN = {
    "bias-missing": (lambda d: _drop(d, "layers.1.self_attn.v_proj.bias"),
                     ["attention_bias", "layers.1.self_attn.v_proj.bias", "missing"]),
    "bias-not-declared": (lambda d: _config(d, attention_bias=False),
                          ["config.json", "attention_bias", "layers.0.self_attn.q_proj.bias"]),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_inconsistent_biases_are_refused(case, published, target_gguf, tmp_path):
    folder = shutil.copytree(published / "gpt-oss-bias", tmp_path / "drafter")
    change, needles = BROKEN[case]
    change(folder)
    out = tmp_path / "out.gguf"
    assert_refused(dflash_gguf("convert", folder, "--target", target_gguf, "-o", out), *needles, out=out)


@pytest.fixture(scope="session")
def f32_models(fixtures, published, tmp_path_factory) -> dict[str, Path]:
    from dflash_gguf.convert.converter import convert
    from training.fixtures.target_model import convert_target

    work = tmp_path_factory.mktemp("f32-bias")
    models = {"target": convert_target(fixtures / "target-hf", work / "target.gguf", "f32"),
              "drafter": work / "gpt-oss-bias.gguf"}
    convert(published / "gpt-oss-bias", models["target"], models["drafter"], "f32")
    return models


@pytest.mark.integration
def test_first_draft_matches_reference(llama_bin, fixtures, published, f32_models):
    """llama-speculative-simple's first draft (greedy, 15 tokens, float32 GGUFs and KV caches) equals
    the z-lab reference's; the same reference without its biases drafts otherwise, so the biases are
    what is compared. Measured: 27599 106636 89580 62272 62272 9061 87533 89580 35002 62272 62272 35002 x4."""
    from tests.llama_tools import parse_drafts, run_tool
    from tests.reference_drafts import _drafter, reference_draft, tokenize
    from tests.runner.test_patches import F32_CACHES, N_DRAFT, PROMPT

    ids = tokenize(fixtures / "target-hf", PROMPT)
    proc = run_tool(llama_bin, "llama-speculative-simple", "-m", f32_models["target"], "-md", f32_models["drafter"],
                    "--spec-type", "draft-dflash", "--spec-draft-n-max", str(N_DRAFT), "-p", PROMPT,
                    "-n", str(N_DRAFT + 1), "--temp", "0", "-c", "512", "-t", "1", *F32_CACHES, "-lv", "5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    drafts = parse_drafts(proc.stderr)
    assert drafts, "no `dflash draft:` line"
    assert (drafts[0].pos, drafts[0].id_last) == (len(ids) - 1, ids[-1])
    drafter = published / "gpt-oss-bias"
    expected = reference_draft(drafter, fixtures / "target-hf", ids[:-1], ids[-1], N_DRAFT)
    assert drafts[0].ids == expected

    model = _drafter(str(drafter))
    saved = {}
    try:
        for layer in model.layers:
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                linear = getattr(layer.self_attn, proj)
                saved[linear] = linear.bias.detach().clone()
                linear.bias.data.zero_()
        assert reference_draft(drafter, fixtures / "target-hf", ids[:-1], ids[-1], N_DRAFT) != expected
    finally:
        for linear, bias in saved.items():
            linear.bias.data.copy_(bias)


@pytest.mark.integration
def test_llama_server_drafts(llama_bin, f32_models, tmp_path):
    from dflash_gguf.runner.server import LlamaServer

    args = ["-md", f32_models["drafter"], "--spec-type", "draft-dflash", "--parallel", "1", "-c", "512", "-t", "1"]
    with LlamaServer(f32_models["target"], args, bin_dir=llama_bin, log_path=tmp_path / "server.log") as server:
        answer = server.client.complete("The capital of France is", 24, ignore_eos=True)
    assert answer.n_predicted == 24
    assert answer.draft_n > 0 and 0 <= answer.draft_n_accepted <= answer.draft_n, answer.timings
