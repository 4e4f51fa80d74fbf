"""Do two sets of sampled continuations come from one distribution? (`validate --temperature T`)

At temperature > 0 speculative decoding promises the target's distribution, not its tokens. The
validator draws N continuations of each prompt with the drafter and N without (every request its
own seed), and tests, at each of the first positions of each prompt, whether the token seen there
has the same distribution in both sets:

- Under the null hypothesis every continuation comes from the same joint distribution, so the
  token at position j has the same marginal distribution in both sets (position j's tokens are
  independent across continuations, whatever their dependence on earlier positions).
- Each (prompt, position) gets Pearson's chi-square test of homogeneity on its 2 x K table of token
  counts. Tokens seen fewer than `MIN_COUNT` times at that position (both sets together) are
  pooled into one class, so that every expected count is at least 5 and the chi-square
  approximation holds; a pooled class still under `MIN_COUNT` joins the smallest other class. A
  position left with one class (every continuation has the same token there) says nothing and
  is not tested. A continuation that ended early counts as the token `ENDED` there.
- Holm's step-down correction over every test run keeps the chance of any false alarm at or
  below alpha whatever the dependence between positions. `p_value` is the smallest adjusted
  p-value; the verdict is "different" when it is below alpha.

Pure functions on token arrays; the validator collects the samples (`validation.validate_sampled`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

TEST_NAME = "chi-square homogeneity per prompt and position, Holm-corrected"
SAME, DIFFERENT = "same", "different"
ENDED = -1  # the token of a continuation that stopped (end of generation) before this position
MIN_COUNT = 10  # per class over both sets: an expected count of at least 5 in each
DEFAULT_ALPHA = 0.01


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square with `df` degrees of freedom (integer df >= 1).

    Q(a, y) = P(X >= x) with a = df/2, y = x/2 obeys Q(a+1, y) = Q(a, y) + y^a e^-y / Gamma(a+1),
    starting from Q(1/2, y) = erfc(sqrt(y)) or Q(1, y) = e^-y; every term is positive, so the sum
    is stable."""
    if df < 1:
        raise ValueError("df must be at least 1")
    if x <= 0:
        return 1.0
    y = x / 2.0
    a = 0.5 if df % 2 else 1.0
    q = math.erfc(math.sqrt(y)) if df % 2 else math.exp(-y)
    while a < df / 2.0:
        q += math.exp(a * math.log(y) - y - math.lgamma(a + 1.0))
        a += 1.0
    return min(1.0, q)


def homogeneity(a: np.ndarray, b: np.ndarray) -> tuple[float, int] | None:
    """Pearson's chi-square statistic and degrees of freedom for "tokens `a` and tokens `b` come
    from one distribution", after pooling rare tokens; None when only one class is left."""
    a, b = np.asarray(a), np.asarray(b)
    _, inverse = np.unique(np.concatenate([a, b]), return_inverse=True)
    counts = np.stack([np.bincount(inverse[: len(a)], minlength=inverse.max() + 1),
                       np.bincount(inverse[len(a):], minlength=inverse.max() + 1)])
    totals = counts.sum(axis=0)
    kept = [counts[:, k] for k in np.flatnonzero(totals >= MIN_COUNT)]
    rare = counts[:, totals < MIN_COUNT].sum(axis=1)
    if rare.sum() >= MIN_COUNT:
        kept.append(rare)
    elif rare.sum() and kept:
        smallest = min(range(len(kept)), key=lambda i: kept[i].sum())
        kept[smallest] = kept[smallest] + rare
    if len(kept) < 2:
        return None
    table = np.stack(kept, axis=1).astype(np.float64)  # 2 x K
    expected = table.sum(axis=1, keepdims=True) * table.sum(axis=0, keepdims=True) / table.sum()
    return float(((table - expected) ** 2 / expected).sum()), table.shape[1] - 1


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


@dataclass
class PositionTest:
    prompt: int  # index into the prompts
    position: int  # index into the new tokens
    statistic: float
    df: int
    p_value: float  # Holm-adjusted


@dataclass
class DistributionTest:
    test: str
    samples: int  # continuations per prompt in each set
    positions: int  # first positions tested in each prompt
    tests: int  # (prompt, position) pairs with at least two classes
    alpha: float
    p_value: float  # smallest Holm-adjusted p-value (1.0 when nothing could be tested)
    verdict: str  # SAME or DIFFERENT
    differing: list[PositionTest] = field(default_factory=list)  # adjusted p-value below alpha

    def to_dict(self) -> dict:
        return asdict(self)


def pad(continuations: Sequence[Sequence[int]], positions: int) -> np.ndarray:
    """(len(continuations), positions) token ids, ENDED after a continuation's last token."""
    out = np.full((len(continuations), positions), ENDED, dtype=np.int64)
    for i, tokens in enumerate(continuations):
        tokens = list(tokens)[:positions]
        out[i, : len(tokens)] = tokens
    return out


def compare_samples(first: Sequence[np.ndarray], second: Sequence[np.ndarray],
                    alpha: float = DEFAULT_ALPHA) -> DistributionTest:
    """`first[q]` and `second[q]`: (samples, positions) token arrays of prompt q (see `pad`)."""
    if len(first) != len(second) or not first:
        raise ValueError("one array of continuations per prompt in each set")
    samples, positions = first[0].shape
    raw: list[tuple[int, int, float, int, float]] = []
    for q, (a, b) in enumerate(zip(first, second)):
        if a.shape != (samples, positions) or b.shape != (samples, positions):
            raise ValueError(f"prompt {q}: expected {samples} continuations of {positions} tokens in each set")
        for j in range(positions):
            result = homogeneity(a[:, j], b[:, j])
            if result is not None:
                raw.append((q, j, result[0], result[1], chi2_sf(*result)))
    adjusted = holm([r[4] for r in raw])
    p_value = min(adjusted, default=1.0)
    differing = sorted((PositionTest(q, j, round(stat, 4), df, p) for (q, j, stat, df, _), p in zip(raw, adjusted)
                        if p < alpha), key=lambda t: t.p_value)
    return DistributionTest(TEST_NAME, samples, positions, len(raw), alpha, p_value,
                            DIFFERENT if p_value < alpha else SAME, differing)
