"""The validator's token comparison: exact, tie, mismatch, and the acceptance maths."""

import numpy as np

from dflash_gguf.runner.compare import (
    MISMATCH,
    TIE,
    acceptance_rate,
    classify,
    first_divergence,
    mean_acceptance_length,
)
from dflash_gguf.runner.validate import verdict


def logits_with(top: int, runner_up: int, gap: float, vocab: int = 10) -> np.ndarray:
    row = np.zeros(vocab, dtype=np.float32)
    row[top], row[runner_up] = 5.0, 5.0 - gap
    return row


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 4], [1, 2, 3]) == 2
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # one run stopped early


def test_near_tie_between_the_top_two_is_a_tie():
    d = classify(logits_with(top=3, runner_up=7, gap=0.01), 2, [1, 2, 7], [1, 2, 3], tolerance=0.05)
    assert d.kind == TIE and d.both_in_top2 and abs(d.top2_margin - 0.01) < 1e-6


def test_near_tie_seen_the_other_way_round_is_a_tie():
    # the unbatched pass may put the speculative token first: still the same two tokens
    d = classify(logits_with(top=7, runner_up=3, gap=0.01), 2, [1, 2, 7], [1, 2, 3], tolerance=0.05)
    assert d.kind == TIE


def test_wide_gap_is_a_mismatch():
    d = classify(logits_with(top=3, runner_up=7, gap=0.5), 2, [1, 2, 7], [1, 2, 3], tolerance=0.05)
    assert d.kind == MISMATCH


def test_token_outside_the_top_two_is_a_mismatch_even_with_a_small_gap():
    d = classify(logits_with(top=3, runner_up=7, gap=0.001), 2, [1, 2, 8], [1, 2, 3], tolerance=0.05)
    assert d.kind == MISMATCH and not d.both_in_top2


def test_acceptance_maths():
    # 4 steps: 3+1, 0+1, 2+1, 1+1 -> 10 tokens, 6 accepted of 4*7 drafted
    assert mean_acceptance_length(produced=10, accepted=6) == 2.5
    assert acceptance_rate(drafted=28, accepted=6) == 6 / 28
    assert mean_acceptance_length(produced=0, accepted=0) == 0.0
    # two requests: their first tokens come from prefill, not from a verification step
    assert mean_acceptance_length(produced=12, accepted=6, requests=2) == 2.5


def test_verdict_allows_ties_unless_strict():
    tie = {"divergences": [{"kind": TIE}]}
    assert verdict(tie, strict=False) == 0 and verdict(tie, strict=True) == 1
    assert verdict({"divergences": [{"kind": MISMATCH}]}, strict=False) == 1
    assert verdict({"divergences": []}, strict=True) == 0
