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


def timings_profile(timings: Iterable[dict]) -> dict:
    """The same profile from the responses' own timings (patch 0008: `draft_n_chosen_hist`,
    `draft_offered_per_depth`, `draft_accepted_per_depth`), summed over requests: what a run that
    does not log its steps (bench) knows. Empty where the build reports none."""
    chosen: Counter[int] = Counter()
    offered: Counter[int] = Counter()
    accepted: Counter[int] = Counter()
    for t in timings:
        for n, count in enumerate(t.get("draft_n_chosen_hist") or []):
            chosen[n] += int(count)
        for i, (o, a) in enumerate(zip(t.get("draft_offered_per_depth") or [], t.get("draft_accepted_per_depth") or [])):
            offered[i + 1] += int(o)
            accepted[i + 1] += int(a)
    return _profile(chosen, offered, accepted, offered)


def _profile(chosen: Counter, offered: Counter, accepted: Counter, reached: Counter) -> dict:
    total = sum(chosen.values())
    depths = [{"depth": d, "offered": offered[d], "accepted": accepted[d],
               "rate": round(accepted[d] / offered[d], 4) if offered[d] else None,
               "conditional": round(accepted[d] / reached[d], 4) if reached[d] else None}
              for d in sorted(offered) if offered[d]]
    return {"steps": total, "draft_lengths": {str(n): chosen[n] for n in sorted(chosen) if chosen[n]},
            "parked_share": round(chosen[0] / total, 4) if total else None, "per_depth": depths}


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
    return _profile(chosen, offered, accepted, reached)


def drafting_lines(profile: dict) -> list[str]:
    """What the steps drafted (validation/acceptance.py depth_profile), as the table prints it."""
    if not profile.get("steps"):
        return []
    steps = profile["steps"]
    lengths = ", ".join(f"{n}: {count}" for n, count in profile["draft_lengths"].items())
    lines = [f"drafts sent per step    {lengths} (of {steps} steps; parked, 0 drafts: "
             f"{profile['parked_share']:.1%})"]
    depths = profile["per_depth"]
    if depths:
        lines.append("acceptance by depth     " + "  ".join(
            f"{d['depth']}: {d['conditional']:.2f}" for d in depths if d["conditional"] is not None)
            + "  (depth i accepted when depth i-1 was)")
    return lines
