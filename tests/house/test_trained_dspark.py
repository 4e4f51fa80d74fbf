"""The trained DSpark drafter (tests/fixtures/trained/dspark, `python -m training.train_pair --stage
dspark`) in the patched llama-server, `--spec-type draft-dspark`: every draft of a greedy run is
what the PyTorch DSpark reference (dflash_gguf.validation.dspark_reference: the DFlash layers, the
Markov chain and the confidence head as the pinned graph computes them) drafts from the same
context, token for token; with `--spec-draft-p-min` the draft stops where the reference's
confidence does. Losslessness and acceptance are tests/house/test_trained_gguf.py's (validate).

Numerics: float32 GGUFs (converted here from the bf16 checkpoints) and float32 KV caches, against
the reference in float32, as tests/runner/test_patches.py compares DFlash drafts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_gguf.runner.server import LlamaServer
from training.fixtures.trained_gguf import TRAINED
from tests.llama_tools import parse_drafts
from tests.reference_drafts import _drafter, reference_draft
from tests.runner.test_patches import F32_CACHES

pytestmark = pytest.mark.integration

BLOCK = 7  # the trained DSpark's block_size; anchor-first, so 7 drafts per block
N_PREDICT = 48


@pytest.fixture(scope="module")
def f32_pair(tmp_path_factory, llama_bin) -> dict[str, Path]:
    from dflash_gguf.convert.converter import convert
    from training.fixtures.target_model import convert_target

    work = tmp_path_factory.mktemp("trained-dspark-f32")
    target = convert_target(TRAINED / "target", work / "target.gguf", "f32")
    convert(TRAINED / "dspark", target, work / "dspark.gguf", "f32")
    return {"target": target, "dspark": work / "dspark.gguf"}


def _prompt_ids() -> list[int]:
    return json.loads((TRAINED / "eval_prompts.json").read_text())["prompts"][0]["ids"]


def _server_drafts(llama_bin: Path, models: dict[str, Path], log: Path, *extra: str):
    ids = _prompt_ids()
    args = ["-md", models["dspark"], "--spec-type", "draft-dspark", "--spec-draft-n-max", str(BLOCK),
            "--parallel", "1", "-c", "512", "-t", "1", *F32_CACHES, "-lv", "5", *extra]
    with LlamaServer(models["target"], args, bin_dir=llama_bin, log_path=log) as server:
        answer = server.client.complete(ids, N_PREDICT, ignore_eos=True)
    assert answer.n_predicted == N_PREDICT
    drafts = parse_drafts(log.read_text(errors="replace"))
    assert drafts, "no `dflash draft:` line in llama-server's log at -lv 5"
    return ids, answer, drafts


def test_drafts_match_reference(llama_bin, f32_pair, tmp_path):
    """The first draft (context = the prompt, block = [the target's first token, mask x 6]) and
    every later one (context = prompt + the tokens generated before it) equal the reference's."""
    ids, answer, drafts = _server_drafts(llama_bin, f32_pair, tmp_path / "server.log")
    text = ids + answer.tokens
    first = drafts[0]
    assert (first.pos, first.id_last) == (len(ids), answer.tokens[0])
    assert len(first.ids) == BLOCK
    assert first.ids == reference_draft(TRAINED / "dspark", TRAINED / "target", ids, first.id_last, BLOCK)
    for draft in drafts[1:]:
        assert draft.id_last == text[draft.pos]
        expected = reference_draft(TRAINED / "dspark", TRAINED / "target", text[:draft.pos], draft.id_last, BLOCK)
        assert draft.ids == expected, draft.pos

    # the Markov chain is part of what is compared: without it the reference drafts otherwise
    w2 = _drafter(str(TRAINED / "dspark")).markov_head.markov_w2.weight
    saved = w2.detach().clone()
    try:
        w2.data.zero_()
        without = [reference_draft(TRAINED / "dspark", TRAINED / "target", text[:d.pos], d.id_last, BLOCK)
                   for d in drafts]
    finally:
        w2.data.copy_(saved)
    assert without != [d.ids for d in drafts]


P_MIN = 0.7  # measured: drafts of 2, 3, 1, 5, 5, 5, 5, 7, 3, 7 tokens in this run (0.9: mostly empty)


def test_confidence_cut_matches_reference(llama_bin, f32_pair, tmp_path):
    """--spec-draft-p-min: llama.cpp stops each draft before the first position whose confidence
    head output is below it; so does the reference, and at least one draft is cut short (else the
    confidence head would not have been compared)."""
    ids, answer, drafts = _server_drafts(llama_bin, f32_pair, tmp_path / "server.log",
                                         "--spec-draft-p-min", str(P_MIN))
    text = ids + answer.tokens
    for draft in drafts:
        expected = reference_draft(TRAINED / "dspark", TRAINED / "target", text[:draft.pos], draft.id_last, BLOCK,
                                   p_min=P_MIN)
        assert draft.ids == expected, draft.pos
    assert any(0 < len(d.ids) < BLOCK for d in drafts), [len(d.ids) for d in drafts]
