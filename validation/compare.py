"""Token-level comparison of a speculative run against the target alone.

Pure functions: the validator feeds them what llama-server returned and the target's logits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


TIE = "tie"
MISMATCH = "mismatch"

# Logit gap to the target's argmax below which an emitted token counts as a floating-point near-tie: batched
# verification is not bit-identical to one-token decoding on some back-ends (llama.cpp #27407,
# #25618), and such a gap can flip the argmax without any bug.
DEFAULT_TIE_TOLERANCE = 0.05


@dataclass
class Finding:
    """A position where the emitted token is not the target's argmax (teacher-forced logits)."""

    position: int  # index into the new tokens
    speculative_token: int  # what the speculative run emitted
    target_token: int  # the target's argmax there
    margin: float  # logit(target_token) - logit(speculative_token), >= 0
    kind: str  # TIE or MISMATCH

    def to_dict(self) -> dict:
        return asdict(self)


def check_tokens(logits: np.ndarray, tokens: list[int], tolerance: float = DEFAULT_TIE_TOLERANCE) -> list[Finding]:
    """Every emitted token against the target's logits for its position (row i predicts tokens[i]).

    A token that is the argmax passes; one whose logit is within `tolerance` of the argmax's is a
    `tie` (a floating-point near-tie: the teacher-forced pass is batched, the run that emitted
    the token was not, or the other way round); anything else a `mismatch`."""
    if len(logits) != len(tokens):
        raise ValueError(f"{len(logits)} rows of logits for {len(tokens)} tokens")
    findings = []
    if not tokens:
        return findings
    rows = np.asarray(logits, dtype=np.float32)
    emitted = np.asarray(tokens, dtype=np.int64)
    best = rows.argmax(axis=1)
    margins = rows[np.arange(len(rows)), best] - rows[np.arange(len(rows)), emitted]
    for i in np.flatnonzero(margins > 0):
        margin = float(margins[i])
        findings.append(Finding(int(i), int(emitted[i]), int(best[i]), margin,
                                TIE if margin < tolerance else MISMATCH))
    return findings
