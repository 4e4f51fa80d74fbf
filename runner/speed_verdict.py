"""What the tools say about speed, computed from the figures just measured: the one place the words
"pays", "slower" and "costs" come from (tune, serve, make demo, make bench), so no sentence can
contradict the numbers printed beside it."""

from __future__ import annotations

DEFAULT_MIN_SPEEDUP = 1.05  # below this, timing noise could make drafting the slower choice
CHEAP_BATCH = 1.5  # a verification batch costing less than this many decoded tokens is close to free


def drafting_pays(speedup: float | None, min_speedup: float = DEFAULT_MIN_SPEEDUP) -> bool:
    """Whether a measured speedup (speculative tokens/s over the target alone's) is worth drafting for."""
    return speedup is not None and speedup >= min_speedup


def _times(value: float, *lines: float) -> str:
    """`value` with the fewest decimals (two at least) at which it falls on the same side of every
    line as its exact value does: never "1.05x, under the 1.05x it must reach" for 1.049."""
    for decimals in range(2, 7):
        shown = round(value, decimals)
        if all((shown >= line) == (value >= line) for line in lines):
            return f"{value:.{decimals}f}x"
    return f"{value!r}x"


def speed_verdict(speedup: float | None, min_speedup: float = DEFAULT_MIN_SPEEDUP, where: str = "here",
                  unreliable: str | None = None) -> str:
    """One clause judging `speedup` against `min_speedup`, e.g. "drafting pays here: 2.07x the target
    alone (at least 1.05x)"; `where` says for what it holds ("" to leave it out). A speedup withheld
    by the measurement (runner/speed.py) comes as None with `unreliable`, its reason."""
    if speedup is None:
        if unreliable:
            return (f"whether {_drafting('pays', where)} is not known: the speedup was not measured reliably "
                    f"({unreliable})")
        return " ".join(w for w in ("no speedup was measured", where) if w)
    shown = _times(speedup, min_speedup, 1.0)
    if drafting_pays(speedup, min_speedup):
        return f"{_drafting('pays', where)}: {shown} the target alone (at least {min_speedup:g}x)"
    if speedup >= 1.0:
        return f"{_drafting('does not pay', where)}: {shown} the target alone, under the {min_speedup:g}x it must reach"
    return f"{_drafting('does not pay', where)}: {shown} the target alone, slower than without it"


def _drafting(verb: str, where: str) -> str:
    return " ".join(w for w in ("drafting", verb, where) if w)


def batch_cost_verdict(batch_over_token: float, batch: int) -> str:
    """One clause on what verifying a batch of `batch` tokens costs, in the target's decoded tokens,
    and the bound that puts on a drafter: speedup / tau at most 1 / that cost."""
    shown = _times(batch_over_token, CHEAP_BATCH)
    if batch_over_token < CHEAP_BATCH:
        return f"a batch of {batch} tokens costs {shown} one decoded token: verifying a block is close to free here"
    return (f"a batch of {batch} tokens costs {shown} one decoded token: verifying a block is not free here, "
            f"and a drafter's speedup is at most {1 / batch_over_token:.2f} of its tau")
