"""The statistics of `validate --temperature`: the chi-square tail, pooling, Holm, the verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dflash_gguf.validation.distribution import (
    DIFFERENT,
    ENDED,
    SAME,
    chi2_sf,
    compare_samples,
    holm,
    homogeneity,
    pad,
)


@pytest.mark.parametrize("x", [0.01, 0.5, 3.0, 12.0, 80.0])
def test_chi2_tail_matches_closed_forms(x):
    assert chi2_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-12)
    assert chi2_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-12)
    assert chi2_sf(x, 4) == pytest.approx(math.exp(-x / 2) * (1 + x / 2), rel=1e-12)
    assert chi2_sf(x, 3) == pytest.approx(math.erfc(math.sqrt(x / 2)) + math.sqrt(2 * x / math.pi) * math.exp(-x / 2),
                                          rel=1e-12)


def test_chi2_tail_textbook_quantiles():
    assert chi2_sf(3.841459, 1) == pytest.approx(0.05, abs=1e-6)
    assert chi2_sf(6.634897, 1) == pytest.approx(0.01, abs=1e-6)
    assert chi2_sf(18.307038, 10) == pytest.approx(0.05, abs=1e-6)
    assert chi2_sf(0.0, 5) == 1.0


def test_holm_step_down():
    assert holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])


def test_rare_tokens_are_pooled_and_single_class_positions_skipped():
    a = np.array([1] * 40 + [2] * 5 + [3] * 5)
    b = np.array([1] * 40 + [2] * 5 + [3] * 2 + [4] * 3)  # totals: 1: 80, 2: 10, 3: 7, 4: 3
    stat, df = homogeneity(a, b)
    assert df == 2  # classes {1}, {2}, {3, 4}
    assert stat == pytest.approx(0.0)  # 5 + 0 against 2 + 3: the pooled class hides the difference
    # one class left: every continuation has token 7 here
    assert homogeneity(np.full(20, 7), np.full(20, 7)) is None
    # a pooled class under 10 joins the smallest kept class instead of standing alone
    assert homogeneity(np.array([1] * 30 + [2] * 10 + [9]), np.array([1] * 30 + [2] * 10 + [8]))[1] == 1


def test_pad_marks_ended_continuations():
    assert pad([[5, 6, 7], [5]], 2).tolist() == [[5, 6], [5, ENDED]]


def _draws(rng: np.random.Generator, probs: np.ndarray, n: int, positions: int) -> np.ndarray:
    return rng.choice(len(probs), size=(n, positions), p=probs)


def test_same_distribution_is_same_and_a_sharper_one_different():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=30) * 1.5
    p = np.exp(logits) / np.exp(logits).sum()
    sharper = np.exp(2 * logits) / np.exp(2 * logits).sum()
    first = [_draws(rng, p, 200, 8) for _ in range(3)]
    same = compare_samples(first, [_draws(rng, p, 200, 8) for _ in range(3)])
    assert same.verdict == SAME and same.p_value >= 0.01 and not same.differing
    assert same.tests == 24 and same.samples == 200 and same.positions == 8
    shifted = compare_samples(first, [_draws(rng, sharper, 200, 8) for _ in range(3)])
    assert shifted.verdict == DIFFERENT and shifted.p_value < 0.01
    assert shifted.differing and all(t.p_value < 0.01 for t in shifted.differing)


def test_mismatched_shapes_are_refused():
    with pytest.raises(ValueError):
        compare_samples([np.zeros((10, 4))], [np.zeros((10, 3))])
