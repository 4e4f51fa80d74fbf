"""Why a speculative run is as fast as it is: how many drafts each step sent for verification, how
often none (a plain target step: "parked"), and how often each depth of a draft was accepted, read
from the steps llama-server logged (validation/server_steps.py).

Depth i of a step is its i-th drafted token; it is offered when the step sent at least i drafts and
accepted when the target took at least i. `conditional` is the chance that depth i is accepted given
that depth i-1 was: what a draft-length controller weighs against the cost of a wider verify batch.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

from .server_steps import Step


def depth_profile(steps: Iterable[Step]) -> dict:
    """The draft lengths chosen, the parked share and per-depth acceptance of `steps` (every
    generation step of a run; replayed and restored steps left out: they verify nothing new)."""
    chosen: Counter[int] = Counter()
    offered: Counter[int] = Counter()
    accepted: Counter[int] = Counter()
    reached: Counter[int] = Counter()  # offered depth i with depth i-1 accepted
    for step in steps:
        if step.restored_from is not None or step.replay:
            continue
        n = step.width - 1
        chosen[n] += 1
        if n == 0 or step.accepted is None:
            continue
        for depth in range(1, n + 1):
            offered[depth] += 1
            reached[depth] += depth - 1 <= step.accepted
            accepted[depth] += depth <= step.accepted
    total = sum(chosen.values())
    depths = []
    for depth in sorted(offered):
        depths.append({"depth": depth, "offered": offered[depth], "accepted": accepted[depth],
                       "rate": round(accepted[depth] / offered[depth], 4),
                       "conditional": round(accepted[depth] / reached[depth], 4) if reached[depth] else None})
    return {"steps": total, "draft_lengths": {str(n): chosen[n] for n in sorted(chosen)},
            "parked_share": round(chosen[0] / total, 4) if total else None, "per_depth": depths}
