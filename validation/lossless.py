"""Judging a greedy run from its replayed rows: lossless, identical, and why they may differ.

Two questions, answered apart:
- *lossless*: is every emitted token the target's argmax in the batch that produced it? A token
  that is not is a `mismatch`: the drafter (or anything between the target and the user) changed
  what the target chose.
- *identical to the target alone*: are the tokens those of plain decoding? Where a lossless run
  differs, the first differing token is a `numerical` divergence: the target chose it in a verify
  batch of width w, and plain decoding chose the other side of a near-tie in a batch of width 1;
  both logits, in both batches, go into the report.

The replay is exact when it reproduces the server's numerics, which the validator checks on the
run it knows best: the replay of the target-alone run must give every one of its tokens. When it
does not (a server flag the replay does not mirror), a margin up to the batching noise measured in
this run (`noise`: the largest logit difference between a row of a verify batch and the same
position decoded alone, over the positions where both runs agree) is `numerical`, and the report
says the tolerance came from there.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

from dflash_gguf.runner.measure import first_divergence
from .compare import MISMATCH
from .replay import Row

NUMERICAL = "numerical"


@dataclass
class Finding:
    """A token worth a line in the report: a mismatch, or the first numerical divergence."""

    kind: str
    position: int            # index into the new tokens
    speculative_token: int   # what the speculative run emitted
    target_token: int        # mismatch: the target's argmax in that batch; numerical: plain decoding's token
    margin: float            # mismatch: logit(argmax) - logit(emitted) in that batch; numerical: see below
    width: int               # rows in the batch that produced the speculative token
    batch_logits: dict | None = None  # numerical: {token: logit} in the verify batch
    plain_logits: dict | None = None  # numerical: {token: logit} when decoded one token at a time
    plain_margin: float | None = None
    note: str = ""

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None and v != ""}


NOT_REPLAYED = "no verify batch in the server's log reaches it, so the replay could not evaluate it"


@dataclass
class PromptJudgement:
    checked: int
    findings: list[Finding] = field(default_factory=list)
    first_divergence: int | None = None
    margins: list[float] = field(default_factory=list)  # per replayed token: logit(argmax) - logit(emitted)

    def not_proven(self, produced: Sequence[int], checked: int | None = None) -> list[dict]:
        """The tokens of `produced` that are not their replayed batch's argmax, each with why; only the
        first `checked` count as replayed (default: every replayed row)."""
        checked = len(self.margins) if checked is None else min(checked, len(self.margins))
        why = {f.position: f.kind for f in self.findings}
        result = []
        for i, token in enumerate(produced):
            if i >= checked:
                reason = NOT_REPLAYED if i >= len(self.margins) else \
                    "differs from the one-at-a-time pass whose batches were replayed (in flight with other requests)"
            elif self.margins[i] > 0:
                reason = (f"{why.get(i, MISMATCH)}: not the argmax of its replayed batch "
                          f"(margin {self.margins[i]:.6f})")
            else:
                continue
            result.append({"position": i, "token": int(token), "why": reason})
        return result

    @property
    def mismatches(self) -> int:
        return sum(f.kind == MISMATCH for f in self.findings)

    @property
    def numerical(self) -> int:
        return sum(f.kind == NUMERICAL for f in self.findings)


def _logit(row: Row, token: int) -> float | None:
    hits = np.flatnonzero(row.top_ids == token)
    return float(row.top_logits[hits[0]]) if hits.size else (row.emitted_logit if token == -1 else None)


def noise_by_width(spec_rows: Sequence[Row], plain_rows: Sequence[Row], agree: int, into: dict[int, float]) -> None:
    """The largest logit difference, per verify width, between the speculative run's rows and
    plain decoding's at the first `agree` positions (same tokens before them), over the tokens in
    both rows' top lists."""
    for spec, plain in zip(spec_rows[:agree], plain_rows[:agree]):
        common = np.intersect1d(spec.top_ids, plain.top_ids)
        if not common.size:
            continue
        a = np.array([_logit(spec, int(t)) for t in common])
        b = np.array([_logit(plain, int(t)) for t in common])
        into[spec.width] = max(into.get(spec.width, 0.0), float(np.max(np.abs(a - b))))


def judge(speculative: Sequence[int], alone: Sequence[int], spec_rows: Sequence[Row], plain_rows: Sequence[Row],
          tolerance: float = 0.0) -> PromptJudgement:
    """Every emitted token against its batch's argmax; the first difference from plain decoding
    explained. `plain_rows` are plain decoding's rows for the target-alone tokens."""
    result = PromptJudgement(checked=len(spec_rows), first_divergence=first_divergence(list(speculative), list(alone)),
                             margins=[row.margin for row in spec_rows])
    for i, row in enumerate(spec_rows):
        if row.margin > tolerance:
            result.findings.append(Finding(MISMATCH, i, int(speculative[i]), row.argmax, round(row.margin, 6),
                                           row.width))
        elif row.margin > 0:
            result.findings.append(Finding(NUMERICAL, i, int(speculative[i]), row.argmax, round(row.margin, 6),
                                           row.width, note="within the batching noise measured in this run"))
    i = result.first_divergence
    if i is not None and i < len(spec_rows) and i < len(plain_rows) and i < len(alone) \
            and spec_rows[i].margin <= tolerance:
        s, t = int(speculative[i]), int(alone[i])
        batch, plain = spec_rows[i], plain_rows[i]
        batch_logits = {str(s): _logit(batch, s), str(t): _logit(batch, t)}
        plain_logits = {str(s): _logit(plain, s), str(t): _logit(plain, t)}
        b_s, b_t = batch_logits[str(s)], batch_logits[str(t)]
        p_s, p_t = plain_logits[str(s)], plain_logits[str(t)]
        result.findings = [f for f in result.findings if f.position != i]
        result.findings.append(Finding(
            NUMERICAL, i, s, t, round(b_s - b_t, 6) if b_t is not None else round(batch.margin, 6), batch.width,
            batch_logits={k: (round(v, 6) if v is not None else None) for k, v in batch_logits.items()},
            plain_logits={k: (round(v, 6) if v is not None else None) for k, v in plain_logits.items()},
            plain_margin=round(p_t - p_s, 6) if p_s is not None else None,
            note=f"a near-tie: in its verify batch of width {batch.width} the target chose {s}; "
                 f"decoding one token at a time it chose {t}"))
        result.findings.sort(key=lambda f: f.position)
    return result
