"""The validator's token comparison: exact, tie, mismatch, and the acceptance maths."""

import numpy as np

from dflash_gguf.runner.measure import acceptance_rate, first_divergence, mean_acceptance_length
from dflash_gguf.validation.compare import MISMATCH, TIE, check_tokens
from dflash_gguf.validation.lossless import NUMERICAL
from dflash_gguf.validation.validate import verdict
from tests.validation_reports import validation_report


def logits_with(top: int, runner_up: int, gap: float, vocab: int = 10) -> np.ndarray:
    row = np.zeros(vocab, dtype=np.float32)
    row[top], row[runner_up] = 5.0, 5.0 - gap
    return row


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 4], [1, 2, 3]) == 2
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # one run stopped early


def test_every_token_is_checked_argmax_tie_and_mismatch():
    rows = np.stack([logits_with(top=3, runner_up=7, gap=0.01), logits_with(top=3, runner_up=7, gap=0.01),
                     logits_with(top=1, runner_up=2, gap=0.5), logits_with(top=4, runner_up=5, gap=0.001)])
    findings = check_tokens(rows, [3, 7, 2, 8], tolerance=0.05)
    assert [(f.position, f.kind) for f in findings] == [(1, TIE), (2, MISMATCH), (3, MISMATCH)]
    assert findings[0].target_token == 3 and abs(findings[0].margin - 0.01) < 1e-6
    assert abs(findings[1].margin - 0.5) < 1e-6
    # a token outside the top two is a mismatch by its own margin (5.0 here), not the top-2 gap
    assert abs(findings[2].margin - 5.0) < 1e-6


def test_equal_logits_are_both_the_argmax():
    row = logits_with(top=3, runner_up=7, gap=0.0)
    assert check_tokens(np.stack([row, row]), [3, 7]) == []


def test_acceptance_maths():
    # 4 steps: 3+1, 0+1, 2+1, 1+1 -> 10 tokens, 6 accepted of 4*7 drafted
    assert mean_acceptance_length(produced=10, accepted=6) == 2.5
    assert acceptance_rate(drafted=28, accepted=6) == 6 / 28
    assert mean_acceptance_length(produced=0, accepted=0) == 0.0
    # two requests: their first tokens come from prefill, not from a verification step
    assert mean_acceptance_length(produced=12, accepted=6, requests=2) == 2.5


def test_verdict_allows_numerical_divergences_unless_strict():
    numerical = validation_report(divergences=[{"kind": NUMERICAL}], exact=False)
    assert verdict(numerical, strict=False) == 0 and verdict(numerical, strict=True) == 1
    assert verdict(validation_report(divergences=[{"kind": MISMATCH}]), strict=False) == 1
    assert verdict(validation_report(), strict=True) == 0
    # a token that was produced but not checked fails the run
    assert verdict(validation_report(produced=64, positions_checked=63), strict=False) == 1
