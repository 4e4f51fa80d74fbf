"""Why a speculative run is as fast as it is: how many drafts each step sent for verification, how
often none (a plain target step: "parked"), and how often each depth of a draft was accepted, read
from the steps llama-server logged (validation/server_steps.py); from the responses' timings, the
run's limit (the speedup its acceptance allows at the controller's measured costs) and where its
time went, part by part, down to what it lost below that limit (patch 0020).

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


def run_limit(timings: Iterable[dict], slots: int = 1) -> dict | None:
    """The speedup a run's own acceptance allows at the costs its controller measured, with no
    overhead: every stretch of text served at its best draft length, knowing how far its block is
    accepted. Patch 0024's `draft_full_tokens_by_accepted[L]`: a response's tokens by the accepted
    length L of the scored whole block whose stretch they are in (a block stands for the tokens from its
    position to the next scored block's, so a parked stretch counts whole, probed once). A token of a
    stretch of L costs the least of verify(slots) (a plain step) and, for n = 1..L,
    (draft(slots) + verify(slots * (n + 1))) / (n + 1) (patch 0013's `draft_pass_cost_ms`,
    `draft_verify_cost_ms`; all slots drafting alike); against one token per verify(slots) ms.
    `best_lengths`: the tokens served at each best length; `ms_per_token`: the time a request waits
    per token at the limit. Tokens before a request's first scored block (and requests with none, a
    slot parked throughout) are left out: no block says what they would have accepted. None without
    those fields (a static length, or a build before 0024)."""
    timings = [t for t in timings if t.get("draft_verify_cost_ms") and t.get("draft_full_tokens_by_accepted")]
    if not timings:
        return None
    verify, draft = _costs(max(timings, key=lambda t: len(t["draft_verify_cost_ms"])))
    plain, tokens, spent, lengths = verify(slots), 0, 0.0, Counter()
    for t in timings:
        for accepted, count in enumerate(t["draft_full_tokens_by_accepted"]):
            if not count:
                continue
            best = min(range(accepted + 1), key=lambda n: _step_ms(n, slots, verify, draft) / (n + 1))
            tokens += int(count)
            spent += int(count) * _step_ms(best, slots, verify, draft) / (best + 1)
            lengths[best] += int(count)
    if not tokens or spent <= 0:
        return None
    return {"limit": round(tokens * plain / spent, 3), "best_lengths": {str(n): c for n, c in sorted(lengths.items())},
            "verify_ms": round(plain, 3), "slots": slots, "ms_per_token": round(spent / tokens, 6)}


def _costs(t: dict):
    """ms by size from one response's cost curves: the server's own prices (patch 0019: as far as the
    widest step its slots can make); past their end (a build without 0019), the last one."""
    curves = [list(t["draft_verify_cost_ms"]), list(t.get("draft_pass_cost_ms") or [0.0])]
    return tuple((lambda c: lambda size: float(c[min(max(size, 1), len(c)) - 1]))(c) for c in curves)


def _step_ms(n: int, slots: int, verify, draft) -> float:
    return max((draft(slots) if n else 0.0) + verify(slots * (n + 1)), 1e-6)


# patch 0020's parts of a response's generation time, and what report lines call them
TIME_PARTS = {"target": "the target's steps", "draft": "draft passes", "feed": "drafter feed",
              "sample": "sampling"}
REST = "the rest (host, controller, other slots' prompts)"


def time_split(timings: Iterable[dict], slots: int = 1) -> dict | None:
    """Where the generation's time went, as each request waited through it (patch 0020's `spec_time_ms`:
    a step shared by several slots counts whole for each), summed over the responses (`rest`:
    predicted_ms less the parts: host round trips, batch building, the controller, and with several
    slots their prompts' steps, which the generating slots wait through) and, where the
    responses carry the controller's costs (0013), what was lost below the limit, per generated token:
    the measured time less the limit's (run_limit) is split exactly into `draft_lengths` (the lengths
    chosen, at the controller's prices, over the best length per stretch in hindsight; with several
    slots every step priced as if all chose alike), `draft_passes` (measured draft passes over the
    price of the steps that drafted: probes, other slots' drafts, passes dearer than priced),
    `target` (the target's steps over their price), `feed`, `sample` and `rest`. None without 0020."""
    timings = [t for t in timings if t.get("spec_time_ms")]
    # the tokens of predicted_ms' window: a request's first token comes with its prompt
    tokens = sum(max(int(t.get("predicted_n") or 0) - 1, 0) for t in timings)
    if not timings or not tokens:
        return None
    parts = {k: sum(float(t["spec_time_ms"].get(k, 0.0)) for t in timings) for k in TIME_PARTS}
    generation = sum(float(t.get("predicted_ms") or 0.0) for t in timings)
    parts["rest"] = max(generation - sum(parts.values()), 0.0)
    out: dict = {"generation_ms": round(generation, 3), "tokens": tokens,
                 "parts_ms": {k: round(v, 3) for k, v in parts.items()}}
    limit = run_limit(timings, slots)
    if limit is not None:
        verify, draft = _costs(max(timings, key=lambda t: len(t["draft_verify_cost_ms"])))
        priced_verify = priced_draft = 0.0
        for t in timings:
            for n, steps in enumerate(t.get("draft_n_chosen_hist") or []):
                priced_verify += steps * verify(slots * (n + 1))
                priced_draft += steps * (draft(slots) if n else 0.0)
        limit_ms = limit["ms_per_token"] * tokens
        lost = {"draft_lengths": priced_verify + priced_draft - limit_ms,
                "draft_passes": parts["draft"] - priced_draft,
                "target": parts["target"] - priced_verify,
                "feed": parts["feed"], "sample": parts["sample"], "rest": parts["rest"]}
        out["below_limit"] = {"measured_ms_per_token": round(sum(parts.values()) / tokens, 4),
                              "limit_ms_per_token": round(limit["ms_per_token"], 4),
                              "lost_ms_per_token": {k: round(v / tokens, 4) for k, v in lost.items()}}
    return out


def limit_fields(timings: Iterable[dict], speedup: float | None, slots: int = 1) -> dict:
    """`limit` (run_limit) and `measured_over_limit` for a report's speed section, and `time`
    (time_split) where the responses carry it; {} with neither."""
    timings = list(timings)
    out: dict = {}
    if (time := time_split(timings, slots)) is not None:
        out["time"] = time
    limit = run_limit(timings, slots)
    if limit is None:
        return out
    ratio = round(speedup / limit["limit"], 3) if speedup is not None and limit["limit"] > 0 else None
    return {"limit": limit, "measured_over_limit": ratio, **out}


def time_lines(speed: dict) -> list[str]:
    """Where a run's generation time went, and what it lost below its limit (time_split), as validate
    and bench print them under the limit line."""
    time = speed.get("time")
    if not time:
        return []
    parts, total = time["parts_ms"], time["generation_ms"] or 1.0
    names = {**TIME_PARTS, "rest": REST}
    lines = ["time by part: " + ", ".join(f"{names[k]} {v / total:.1%}" for k, v in parts.items())
             + f" of {total / 1000:.2f} s generating"]
    if below := time.get("below_limit"):
        lost = below["lost_ms_per_token"]
        labels = {"draft_lengths": "draft lengths chosen", "draft_passes": "draft passes beyond them (probes, other slots')",
                  "target": "the target's steps beyond their price", "feed": "drafter feed",
                  "sample": "sampling", "rest": "the rest"}
        lines.append(f"below the limit: {below['measured_ms_per_token']:.3f} ms per token against "
                     f"{below['limit_ms_per_token']:.3f} at the limit; "
                     + ", ".join(f"{labels[k]} {v:+.3f}" for k, v in lost.items()))
    return lines


def limit_line(speed: dict) -> str | None:
    """How close the measured speedup came to the run's limit, as validate and bench print it."""
    limit = speed.get("limit")
    if not limit:
        return None
    lengths = ", ".join(f"{n}: {c}" for n, c in limit["best_lengths"].items())
    ratio = speed.get("measured_over_limit")
    measured = f"measured / limit {ratio:.2f}" if ratio is not None else "measured / limit: not measured reliably"
    return (f"limit {limit['limit']:.2f}x at the controller's costs with no overhead, each stretch at its best "
            f"length in hindsight (tokens by length {lengths}); {measured}")
