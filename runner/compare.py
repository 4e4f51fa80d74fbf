"""Token-level comparison of a speculative run against the target alone, and the acceptance maths.

Pure functions: the validator feeds them what llama-server returned and the target's logits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

TIE = "tie"
MISMATCH = "mismatch"

# Logit gap below which the target's top two tokens count as a floating-point near-tie: batched
# verification is not bit-identical to one-token decoding on some back-ends (llama.cpp #27407,
# #25618), and such a gap can flip the argmax without any bug.
DEFAULT_TIE_TOLERANCE = 0.05


@dataclass
class Divergence:
    position: int  # index into the new tokens
    speculative_token: int | None  # None: the speculative run stopped here
    target_token: int | None  # None: the target-only run stopped here
    top2_margin: float | None  # target's logit(top1) - logit(top2) at that position
    both_in_top2: bool  # the two diverging tokens are the target's top two, in either order
    kind: str  # TIE or MISMATCH

    def to_dict(self) -> dict:
        return asdict(self)


def first_divergence(speculative: list[int], target: list[int]) -> int | None:
    """Index of the first differing new token (or where one run ends early); None if identical."""
    for i, (a, b) in enumerate(zip(speculative, target)):
        if a != b:
            return i
    return None if len(speculative) == len(target) else min(len(speculative), len(target))


def classify(logits: np.ndarray | None, position: int, speculative: list[int], target: list[int],
             tolerance: float = DEFAULT_TIE_TOLERANCE) -> Divergence:
    """A divergence is a tie when the two diverging tokens are the target's top two and their logit
    gap is below `tolerance`; anything else is a mismatch. Either order counts: the logits here are
    computed by a separate, unbatched pass, which may itself land on the other side of the tie."""
    spec_tok = speculative[position] if position < len(speculative) else None
    tgt_tok = target[position] if position < len(target) else None
    margin, both = None, False
    if logits is not None:
        order = np.argsort(logits)[::-1][:2]
        margin = float(logits[order[0]] - logits[order[1]])
        both = {int(order[0]), int(order[1])} == {spec_tok, tgt_tok}
    kind = TIE if both and margin is not None and margin < tolerance else MISMATCH
    return Divergence(position, spec_tok, tgt_tok, margin, both, kind)


def mean_acceptance_length(produced: int, accepted: int, requests: int = 0) -> float:
    """tau: tokens produced per target verification step, the bonus token included (DFlash paper).

    Every step yields its accepted draft tokens plus one token of the target's own, so the number
    of steps is produced - accepted. Each request's first token comes from the prompt's prefill,
    not from a verification step; `requests` leaves those out, as the reference's
    `acceptance_lengths` does."""
    tokens = produced - requests
    steps = tokens - accepted
    return tokens / steps if steps > 0 else 0.0


def acceptance_rate(drafted: int, accepted: int) -> float:
    return accepted / drafted if drafted else 0.0
