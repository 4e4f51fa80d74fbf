"""A speedup users can trust: the target alone (A) and the speculative server (B) measured in turns on
the same prompts, and the one judgement of whether the figure can be printed.

Timings on a shared machine drift from second to second, so a ratio of one pass of each server is
meaningless (make demo once printed 0.051x and 14.7x for the same pair). Both servers stay up; every
round sends each prompt to both, one request after the other, and which goes first alternates by
prompt and by round (A B, B A, ...). A round's ratio is B's tokens/s over A's, each from the server's
own generation timings summed over the round; the speedup is the median of the rounds, printed with
their range and count.

Two llama-server processes started by one command may differ for as long as they run (this project's
2-core VM: eight pairs of target-alone servers at 4 streams, the medians of their rounds 0.927-1.090,
about what four rounds of one pair spread; docs/speed.md#fresh-servers), which interleaving within one
pair does not average out: every round would carry the same offset. `RoundServers(fresh=True)` starts a new pair for each round instead, the one
started first alternating, so that offset lands in the rounds' spread, where the judgement sees it.

What the run cannot support is withheld, never printed as a number (`Speedup.unreliable` says why):
- a ratio above tau: every verify step costs at least one target token, so drafting can give at most
  tau times the target alone's speed; a round beyond it is a measuring error;
- a range wider than the effect: the rounds spread over more than the median's distance from 1x (and
  over more than RANGE_FLOOR), so the run cannot say on which side of 1x, or how far, it lies. With
  enough rounds the spread judged is the median's 95 % interval (`median_interval`: the k-th smallest
  and k-th largest round, which bracket the true median with at least 95 % whatever the rounds'
  distribution), not the range: more rounds widen the range but narrow where the median can lie;
  below 9 rounds no narrower pair of rounds reaches 95 % and the interval is the range;
- fewer than MIN_ROUNDS rounds.
When the machine is oversubscribed (1-minute load average above the CPUs this process may use), the
reason says so, with both figures.
"""

from __future__ import annotations

import math
import os
import statistics
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable, Sequence

from dflash_gguf.progress import Progress, stage

from .client import Completion, LlamaClient
from .server import LlamaServer

MIN_ROUNDS = 3
# a range this narrow is a figure, even when its median lies within it of 1x
RANGE_FLOOR = 0.05
# tau below this: (nearly) every step verified no drafted token, as a controller that parks does
PARKED_TAU = 1.05


def cpus() -> int:
    """The CPUs this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def oversubscribed(load: float | None, cores: int) -> str | None:
    """A clause naming the load against the cores, when the load exceeds them."""
    if load is None or load <= cores:
        return None
    return f"the machine is oversubscribed (load average {load:.2f} on {cores} core{'s' * (cores != 1)})"


CONFIDENCE = 0.95


def median_interval(ratios: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The narrowest [k-th smallest, k-th largest] of `ratios` that holds their distribution's median
    with at least `confidence` (by the sign test: 1 - 2 P(Binomial(n, 1/2) <= k - 1)); the whole range
    when no narrower pair does."""
    xs, n = sorted(ratios), len(ratios)
    below = lambda k: sum(math.comb(n, i) for i in range(k)) / 2 ** n  # noqa: E731  P(B <= k - 1)
    k = 1
    while k + 1 <= (n + 1) // 2 and 1 - 2 * below(k + 1) >= confidence:
        k += 1
    return xs[k - 1], xs[n - k]


@dataclass(frozen=True)
class Speedup:
    """A measured ratio with its spread, and why it cannot be printed (None: it can)."""

    ratios: tuple[float, ...]
    unit: str                      # what each ratio is: "round" or "request pair"
    tau: float | None              # the bound (1.0 for a run that drafted nothing); None: not known
    load: float | None             # the highest 1-minute load average seen while measuring
    cores: int
    unreliable: str | None

    @property
    def measured(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None

    @property
    def value(self) -> float | None:
        """The figure to print and to decide on: None when the run cannot support one."""
        return None if self.unreliable else self.measured

    @property
    def range(self) -> tuple[float, float] | None:
        return (min(self.ratios), max(self.ratios)) if self.ratios else None

    @property
    def interval(self) -> tuple[float, float] | None:
        """Where the median of such rounds lies, 95 % (median_interval; the range below 9 rounds)."""
        return median_interval(self.ratios) if self.ratios else None

    @property
    def beyond_tau(self) -> bool:
        return self.tau is not None and any(r > self.tau for r in self.ratios)

    def to_dict(self) -> dict:
        """The figures; a run with a ratio above tau gives none of its ratios (no figure above tau is
        printed anywhere), only why."""
        rounded = lambda x: None if x is None else round(x, 3)  # noqa: E731
        ratios = () if self.beyond_tau else self.ratios
        return {"speedup": rounded(self.value), "speedup_unreliable": self.unreliable,
                "speedup_measured": rounded(statistics.median(ratios)) if ratios else None,
                "speedup_range": [round(min(ratios), 3), round(max(ratios), 3)] if ratios else None,
                "speedup_interval": [round(x, 3) for x in median_interval(ratios)] if ratios else None,
                "speedup_runs": [round(x, 3) for x in ratios], "speedup_unit": self.unit,
                "tau_bound": rounded(self.tau), "load_average": rounded(self.load), "cores": self.cores}

    def shown(self) -> str:
        return shown(self.to_dict())


def shown(speed: dict) -> str:
    """A `Speedup.to_dict()` (as a report holds it) in words: the figure with its spread, or "not
    measured reliably here: <why>"."""
    if speed.get("speedup") is None:
        return f"not measured reliably here: {speed.get('speedup_unreliable') or 'nothing was measured'}"
    lo, hi = speed["speedup_range"]
    runs = len(speed["speedup_runs"])
    within = speed.get("speedup_interval") or [lo, hi]
    interval = f"; 95 % interval of the median {within[0]:.3f}-{within[1]:.3f}" if within != [lo, hi] else ""
    return (f"{speed['speedup']:.3f}x (median of {plural(speed['speedup_unit'], runs)}, interleaved; "
            f"range {lo:.3f}-{hi:.3f}{interval})")


def plural(unit: str, n: int) -> str:
    """"3 rounds", "1 paired pass", "6 paired passes"."""
    return f"{n} {unit}" if n == 1 else f"{n} {unit}{'es' if unit.endswith('s') else 's'}"


def not_measured(why: str) -> Speedup:
    return Speedup((), "round", None, None, cpus(), why)


def judge(ratios: Sequence[float], tau: float | None, unit: str = "round", load: float | None = None,
          cores: int | None = None, min_rounds: int = MIN_ROUNDS) -> Speedup:
    """The `Speedup` of `ratios` (speculative over target alone), bounded by `tau` when drafting ran."""
    ratios = tuple(float(r) for r in ratios if r > 0)
    tau = tau if tau and tau > 0 else None  # 0: no verify step at all (mean_acceptance_length), no bound known
    cores = cores or cpus()
    why = _why(ratios, tau, unit, min_rounds)
    busy = oversubscribed(load, cores)
    if why and busy:
        why = f"{why}; {busy}"
    return Speedup(ratios, unit, tau, load, cores, why)


def _why(ratios: tuple[float, ...], tau: float | None, unit: str, min_rounds: int) -> str | None:
    if len(ratios) < min_rounds:
        return f"{plural(unit, len(ratios))} measured, at least {min_rounds} are needed"
    median = statistics.median(ratios)
    if tau is not None and max(ratios) > tau:
        above = sum(r > tau for r in ratios)
        if tau < PARKED_TAU:
            return (f"{above} of the {plural(unit, len(ratios))} came out above tau {tau:.2f}: the speculative server "
                    "verified almost no drafted token (parked), so it ran the target's own steps and can at best "
                    f"match it; the rest is the spread of two servers (slowest {unit} {min(ratios):.2f}x)")
        return (f"{above} of the {plural(unit, len(ratios))} came out above tau {tau:.2f}, the most drafting can "
                "give (every verify step costs at least one target token): a measuring error")
    lo, hi = median_interval(ratios)
    if hi - lo > max(abs(median - 1.0), RANGE_FLOOR):
        if (lo, hi) == (min(ratios), max(ratios)):
            return (f"the {plural(unit, len(ratios))} range from {lo:.2f}x to {hi:.2f}x, wider than the effect "
                    f"(median {median:.2f}x)")
        return (f"the median of the {plural(unit, len(ratios))} lies between {lo:.2f}x and {hi:.2f}x (95 %), "
                f"wider than the effect (median {median:.2f}x)")
    return None


# ---------------------------------------------------------------------------------------------
# Measuring: both servers up, requests in turns
# ---------------------------------------------------------------------------------------------

def generation_speed(completions: Sequence[Completion]) -> float:
    """Tokens per second of generation, from the server's own timings (prompt evaluation left out)."""
    tokens = sum(c.n_predicted for c in completions)
    ms = sum(float(c.timings.get("predicted_ms", 0.0)) for c in completions)
    return tokens / (ms / 1000.0) if ms > 0 else 0.0


@dataclass
class Rounds:
    """What interleaved rounds measured: per round, each side's tokens/s, and every answer."""

    alone: list[float]
    speculative: list[float]
    answers: list[Completion]      # the speculative server's, every round (acceptance counts)
    load: float | None
    server_pairs: int = 1          # pairs of servers the rounds ran on (RoundServers.started)

    @property
    def ratios(self) -> list[float]:
        return [b / a for a, b in zip(self.alone, self.speculative) if a > 0 and b > 0]

    def speedup(self, tau: float | None) -> Speedup:
        return judge(self.ratios, tau, "round", self.load)

    def tokens_per_second(self) -> dict[str, float]:
        """The median round's tokens/s of each side."""
        return {"target": round(statistics.median(self.alone), 2) if self.alone else 0.0,
                "speculative": round(statistics.median(self.speculative), 2) if self.speculative else 0.0}


class RoundServers:
    """The servers each round of a measurement runs on (a context manager; `servers(r)` gives round
    r's, started and warmed up, by name in `makers`' order): the same ones for every round, or with
    `fresh` new ones for each new r, the previous ones stopped first, the order they start in rotating
    by round (module docstring). `makers`: name -> a function giving that server, not started;
    `warm_up(server)` sends what is not measured."""

    def __init__(self, makers: dict[str, Callable[[], LlamaServer]], fresh: bool,
                 warm_up: Callable[[LlamaServer], object]):
        self.makers, self.fresh, self.warm_up = makers, fresh, warm_up
        self.started = 0  # sets of servers started, for the report
        self._stack = ExitStack()
        self._servers: dict[str, LlamaServer] | None = None
        self._round: int | None = None

    def __enter__(self) -> "RoundServers":
        return self

    def __exit__(self, *exc_info) -> None:
        self._stack.close()

    def servers(self, r: int) -> dict[str, LlamaServer]:
        if self._servers is None or (self.fresh and r != self._round):
            self._stack.close()
            names = list(self.makers)
            order = names[r % len(names):] + names[:r % len(names)]
            started = {name: self._stack.enter_context(self.makers[name]()) for name in order}
            for name in order:
                self.warm_up(started[name])
            self._servers = {name: started[name] for name in names}
            self.started += 1
        self._round = r
        return self._servers


def interleaved_rounds(pairs: Callable[[int], tuple[LlamaClient, LlamaClient]], prompts: Sequence[Sequence[int]],
                       ask: Callable[[LlamaClient, Sequence[int]], Completion], rounds: int,
                       progress: Progress | None = None) -> Rounds:
    """`rounds` passes over `prompts`, each prompt sent to both servers one after the other, the first
    alternating by prompt and round. `pairs(r)`: round r's clients, the target alone's and the
    speculative server's (RoundServers). `ask` sends one request (the same for both)."""
    out = Rounds([], [], [], load_average())
    with stage(progress, "speed: requests", total=2 * rounds * len(prompts)) as requests:
        def answer(client: LlamaClient, ids: Sequence[int]) -> Completion:
            completion = ask(client, ids)
            requests.advance()
            return completion

        for r in range(rounds):
            alone, speculative = pairs(r)
            mine: list[Completion] = []
            theirs: list[Completion] = []
            for i, ids in enumerate(prompts):
                if (i + r) % 2:
                    mine.append(answer(speculative, ids))
                    theirs.append(answer(alone, ids))
                else:
                    theirs.append(answer(alone, ids))
                    mine.append(answer(speculative, ids))
            out.alone.append(generation_speed(theirs))
            out.speculative.append(generation_speed(mine))
            out.answers += mine
            out.load = max(filter(None, (out.load, load_average())), default=None)
            a, b = out.alone[-1], out.speculative[-1]
            # tokens/s only: a round's ratio is judged with the others (judge), never printed alone
            requests.say(f"speed round {r + 1}/{rounds}: target alone {a:.1f} tok/s, speculative {b:.1f} tok/s")
    return out
