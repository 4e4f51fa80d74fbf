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
    `draft_verify_cost_ms`; all slots drafting alike); against one token per verify(slots) ms. Each
    response is priced at the costs it carries, its server's when it ran: a run of several servers (new
    ones every round) is not priced at one server's speed. `best_lengths`: the tokens served at each
    best length; `verify_ms`: a plain step's price, averaged over the tokens; `ms_per_token`: the time a
    request waits per token at the limit; `one_length`: the same with every stretch at the one length
    that serves the run best (its `limit`, `length` and `ms_per_token`): the best static setting at
    the run's prices and acceptance, priced on one server's clock. Tokens before a request's first
    scored block (and requests with none, a slot parked throughout) are left out: no block says what
    they would have accepted. None without those fields (a static length, or a build before 0024)."""
    timings = list(timings)
    plain, tokens, spent, lengths = _stretches(timings, slots)
    if not tokens or spent <= 0:
        return None
    one, length = _one_length(timings, slots)
    return {"limit": round(plain / spent, 3), "best_lengths": {str(n): c for n, c in sorted(lengths.items())},
            "verify_ms": round(plain / tokens, 3), "slots": slots, "ms_per_token": round(spent / tokens, 6),
            "one_length": {"limit": round(plain / one, 3), "length": length, "ms_per_token": round(one / tokens, 6)}}


def _stretches(timings: list[dict], slots: int) -> tuple[float, int, float, Counter]:
    """run_limit's sums over the scored stretches: their tokens' price in plain steps, their count, their
    price at the best length each, and the tokens by that length."""
    plain = spent = 0.0
    tokens, lengths = 0, Counter()
    for t in filter(_priced, timings):
        verify, draft = _costs(t)
        for accepted, count in enumerate(t.get("draft_full_tokens_by_accepted") or []):
            if not count:
                continue
            best = min(range(accepted + 1), key=lambda n: _step_ms(n, slots, verify, draft) / (n + 1))
            tokens += int(count)
            plain += int(count) * verify(slots)
            spent += int(count) * _step_ms(best, slots, verify, draft) / (best + 1)
            lengths[best] += int(count)
    return plain, tokens, spent, lengths


def _one_length(timings: list[dict], slots: int) -> tuple[float, int]:
    """The scored stretches' price with the whole run at the one length that serves them best (a step
    of n emits min(L, n) + 1 tokens of a stretch accepted to L; 0: plain steps), and that length: the
    best static setting at the run's own prices and acceptance, on one server's clock."""
    counts = []
    for t in filter(_priced, timings):
        verify, draft = _costs(t)
        counts += [(accepted, int(c), verify, draft)
                   for accepted, c in enumerate(t.get("draft_full_tokens_by_accepted") or []) if c]
    price = lambda n: sum(c * _step_ms(n, slots, v, d) / (min(a, n) + 1) for a, c, v, d in counts)  # noqa: E731
    best = min(range(max((a for a, *_ in counts), default=0) + 1), key=price)
    return price(best), best


def _priced(t: dict) -> bool:
    """Whether a response carries the costs its controller decided with (patch 0013)."""
    return bool(t.get("draft_verify_cost_ms"))


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
    the measured time less the limit's (run_limit) is split exactly into `hindsight` (the run at its one
    best length over each stretch at its own: where blocks would be accepted, which no controller knows
    before drafting), `draft_lengths` (the lengths chosen, at the controller's prices, over that one
    length: below 0 where choosing beats the best static length; with several slots every step priced
    as if all chose alike), `draft_passes` (measured draft passes over the
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
    plain, scored, spent, _ = _stretches(timings, slots)
    if scored and spent > 0:
        # each response at its own server's prices, its tokens at the limit at the run's gain over
        # them (those before its first scored block too: no block says what they would have accepted)
        gain, one_gain, average = plain / spent, plain / _one_length(timings, slots)[0], plain / scored
        priced_verify = priced_draft = limit_ms = one_ms = 0.0
        for t in timings:
            verify, draft = _costs(t) if _priced(t) else (lambda _: average, lambda _: 0.0)
            for n, steps in enumerate(t.get("draft_n_chosen_hist") or []):
                priced_verify += steps * verify(slots * (n + 1))
                priced_draft += steps * (draft(slots) if n else 0.0)
            plain_ms = max(int(t.get("predicted_n") or 0) - 1, 0) * verify(slots)
            limit_ms, one_ms = limit_ms + plain_ms / gain, one_ms + plain_ms / one_gain
        lost = {"hindsight": one_ms - limit_ms, "draft_lengths": priced_verify + priced_draft - one_ms,
                "draft_passes": parts["draft"] - priced_draft,
                "target": parts["target"] - priced_verify,
                "feed": parts["feed"], "sample": parts["sample"], "rest": parts["rest"]}
        out["below_limit"] = {"measured_ms_per_token": round(sum(parts.values()) / tokens, 4),
                              "limit_ms_per_token": round(limit_ms / tokens, 4),
                              "lost_ms_per_token": {k: round(v / tokens, 4) for k, v in lost.items()}}
    return out


def limit_fields(timings: Iterable[dict], speedup: float | None, slots: int = 1) -> dict:
    """`limit` (run_limit), `measured_over_limit` and `measured_over_one_length_limit` (over the best
    static length's speedup at the run's prices) for a report's speed section, and `time`
    (time_split) where the responses carry it; {} with neither."""
    timings = list(timings)
    out: dict = {}
    if (time := time_split(timings, slots)) is not None:
        out["time"] = time
    limit = run_limit(timings, slots)
    if limit is None:
        return out
    over = lambda x: round(speedup / x, 3) if speedup is not None and x > 0 else None  # noqa: E731
    return {"limit": limit, "measured_over_limit": over(limit["limit"]),
            "measured_over_one_length_limit": over(limit["one_length"]["limit"]), **out}


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
        labels = {"hindsight": "hindsight (where blocks are accepted)",
                  "draft_lengths": "draft lengths chosen against the best single length", "draft_passes": "draft passes beyond them (probes, other slots')",
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
    ratio, over_one = speed.get("measured_over_limit"), speed.get("measured_over_one_length_limit")
    measured = (f"measured / limit {ratio:.2f}, / the best single length's {over_one:.2f}"
                if ratio is not None and over_one is not None else "measured / limit: not measured reliably")
    one = limit.get("one_length")
    one_length = f", {one['limit']:.2f}x at the best single length (n {one['length']})" if one else ""
    return (f"limit {limit['limit']:.2f}x at the controller's costs with no overhead, each stretch at its best "
            f"length in hindsight (tokens by length {lengths}){one_length}; {measured}")
