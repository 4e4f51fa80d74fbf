"""`dflash-gguf tune`: the fastest drafting setting on this machine, and whether drafting pays at all.

Every setting is one llama-server started by serve's launch recipe (runner/launch.py) with tune's
flags added before the user's own arguments: `-t` threads, `--spec-draft-n-max` (at most the
drafter's trained length, dflash_gguf/gguf/describe.py) and `--spec-draft-p-min`; or the target alone. Its
speed is measured as validate measures it (validation/validate.py: a warm-up, then the prompts one at
a time as token ids, greedy; tokens / generation time from the server's own timings).

Timings on a shared machine drift from second to second, so no two speeds taken at different
times are compared. A reference server, the target alone, stays up while each setting's server
runs in turn; a *paired pass* sends every prompt to both, one request after the other (which goes
first alternates), and gives the setting's tokens/s over the reference's in that pass. A setting's
speedup is the median, over all its request pairs, of its speed over the reference's: a burst of
load that slows a few requests moves it little. A setting far slower than the reference after a
few pairs is not measured further.

    1 threads, target alone   the target alone at each thread count (1..CPUs; beyond 4, powers
                              of two and the count): a few requests each pick a first reference,
                              the others are paired against it; the fastest becomes the
                              reference for everything after
    2 threads, drafter        the drafter at its trained length at each thread count
    3 draft length            powers of two up to the trained length at the best thread count,
                              then midpoints around the best (coarse to fine)
    4 p_min                   a few confidence cut-offs at the best length
    5 controller              --spec-draft-n-max auto (ggml_patches/0008: the length chosen per
                              step from live acceptance and measured costs), and again at the best
                              chain's p_min where it has one; reported beside the static settings,
                              the faster preferred within CONTROLLER_MARGIN of the best
    6 draft tree              --spec-tree-budget 8, 16, 32 (ggml_patches/0009: a tree of drafts from
                              the drafter's one pass, verified in one batch) at the trained length;
                              DFlash and DFlash 2 drafters only (a DSpark drafter verifies the chain)
    7 tree floor              --spec-tree-p-min 0.1, 0.2, 0.4, 0.6 with a budget of 16 at the
                              trained length (ggml_patches/0017: no node whose path probability is
                              below the floor, so a step verifies fewer nodes where the drafter is
                              unsure)
    8 confirmation            the best setting again, in fresh passes (the search's best is the
                              luckiest of many noisy estimates), judged by runner/speed.py: the
                              reported speedup, and the verdict: drafting pays when it reaches
                              `min_speedup`

What the user fixes after `--` (`-t`, `--spec-draft-n-max`, `--spec-draft-p-min`,
`--spec-tree-budget`, `--spec-tree-p-min`) is not swept.
Two servers are up at a time (the reference and the setting measured), so the target's memory
is needed twice unless its weights are mapped from one file (llama.cpp's default on CPU).
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from dflash_gguf import typed_reader as values
from dflash_gguf.errors import ServerError, ServerStartError
from dflash_gguf.progress import Stage, working
from dflash_gguf.settings import Settings, refusal
from .build import build_info, find_bin_dir
from .client import Completion, LlamaClient
from dflash_gguf.options import AUTO
from .launch import (MAX_TREE_BUDGET, ONE_CLIENT_PER_RPC_SERVER, THREADS, launch_recipe, parse_server_args,
                     read_draft)
from .measure import Progress, ServerRun, mean_acceptance_length, measuring_launch
from .prompts import Prompt, tokenize_prompts
from .server import LlamaServer
from .speed import Speedup, cpus, judge, load_average
from .speed_verdict import DEFAULT_MIN_SPEEDUP, drafting_pays

P_MIN = ("--spec-draft-p-min", "--draft-p-min")
P_MINS = (0.2, 0.4, 0.6, 0.8)
QUICK_P_MINS = (0.5,)
REFINE_STEPS = 3            # midpoint rounds around the best draft length
TREE_BUDGETS = (8, 16, 32)  # nodes of a draft tree, as published tree verifiers sweep them
QUICK_TREE_BUDGETS = (16,)
# path probability floors (ggml_patches/0017), at a budget of 16: with a floor the budget binds only where the
# drafter is sure of a path, which 16 nodes follow through the longest published block (15 drafted)
TREE_P_MINS = (0.1, 0.2, 0.4, 0.6)
QUICK_TREE_P_MINS = (0.4,)
TREE_FLOOR_BUDGET = 16
# a setting whose median ratio in its first pass, after this many request pairs, is below this is not
# measured further: it cannot become the fastest, and a slow one (threads fighting over busy cores)
# costs minutes
ABANDON_AFTER, ABANDON_BELOW = 4, 0.33
# the controller (--spec-draft-n-max auto) is served when it measures within this of the best static
# length: it also follows text the tuning prompts do not show
CONTROLLER_MARGIN = 0.97
# ... and one request taking this many times the reference's (at least SLOW_MIN_SECONDS) is not waited for
SLOW_FACTOR, SLOW_MIN_SECONDS = 6, 5.0
PROBE_REQUESTS = 2          # per thread count, to pick the first reference


MAX_THREADS = 512      # llama.cpp's GGML_MAX_N_THREADS
MAX_DRAFT = 1 << 16    # far above any drafter's block; llama.cpp clamps to the drafter's own length
MAX_TREE_P_MIN = 0.999  # llama-server refuses a floor of 1 (no node could pass it)


def _optional(read, source: object, name: str, data: dict, *args, **kwargs):
    value = data.get(name.rpartition(".")[2])
    return None if value is None else read(source, name, value, *args, **kwargs)


@dataclass(frozen=True)
class Setting:
    """One way to serve: with the drafter or not, and the llama-server flags tune sweeps.
    None: not set by tune (llama.cpp's default, the drafter's trained length, or the user's own
    value after `--`)."""

    drafting: bool
    threads: int | None = None
    draft_max: int | str | None = None  # AUTO: llama-server's draft-length controller
    p_min: float | None = None
    tree_budget: int | None = None      # --spec-tree-budget: a draft tree of this many nodes per step
    tree_p_min: float | None = None     # --spec-tree-p-min: ... and no node whose path probability is below it

    def server_args(self) -> list[str]:
        """What this setting adds before the user's arguments (the draft length goes to the launch)."""
        args = ["-t", str(self.threads)] if self.threads is not None else []
        if self.drafting and self.p_min is not None:
            args += ["--spec-draft-p-min", f"{self.p_min:g}"]
        if self.drafting and self.tree_budget:
            args += ["--spec-tree-budget", str(self.tree_budget)]
            if self.tree_p_min is not None:
                args += ["--spec-tree-p-min", f"{self.tree_p_min:g}"]
        return args

    def label(self) -> str:
        if not self.drafting:
            return "target alone" + (f" -t {self.threads}" if self.threads is not None else "")
        parts = ["drafter"]
        if self.threads is not None:
            parts.append(f"-t {self.threads}")
        if self.draft_max is not None:
            parts.append(f"n_max {self.draft_max}")
        if self.p_min is not None:
            parts.append(f"p_min {self.p_min:g}")
        if self.tree_budget:
            parts.append(f"tree {self.tree_budget}")
            if self.tree_p_min is not None:
                parts.append(f"floor {self.tree_p_min:g}")
        return " ".join(parts)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: object, source: object = "tuned setting", name: str = "chosen") -> "Setting":
        """A setting as `to_dict` wrote it, every value typed and ranged (InputError naming `source` and
        the field): a record read back is untrusted, and each value becomes a llama-server flag."""
        data = values.mapping(source, name, data)
        return cls(drafting=values.boolean(source, f"{name}.drafting", data.get("drafting")),
                   threads=_optional(values.integer, source, f"{name}.threads", data, 1, MAX_THREADS),
                   draft_max=AUTO if data.get("draft_max") == AUTO else
                   _optional(values.integer, source, f"{name}.draft_max", data, 1, MAX_DRAFT),
                   p_min=_optional(values.number, source, f"{name}.p_min", data, lo=0.0, hi=1.0),
                   tree_budget=_optional(values.integer, source, f"{name}.tree_budget", data, 0, MAX_TREE_BUDGET),
                   tree_p_min=_optional(values.number, source, f"{name}.tree_p_min", data, lo=0.0, hi=MAX_TREE_P_MIN))


@dataclass
class Candidate:
    """What one setting measured, over all the rounds it ran in."""

    setting: Setting
    against: str = ""                                             # the reference's label
    stages: list[str] = field(default_factory=list)
    tokens_per_second: list[float] = field(default_factory=list)  # one per paired pass over the prompts
    reference: list[float] = field(default_factory=list)          # the target alone's, in the same pass
    ratios: list[float] = field(default_factory=list)             # per request pair: its speed / the reference's
    produced: int = 0
    drafted: int = 0
    accepted: int = 0
    requests: int = 0
    load: float | None = None  # the highest 1-minute load average seen after a pass
    servers: int = 0          # the server processes its passes ran on (with a new reference each: fresh_servers)
    abandoned: bool = False   # stopped early, far slower than the reference
    stalled: bool = False     # ... because a request took SLOW_FACTOR times the reference's, or more
    error: str | None = None

    @property
    def speed(self) -> float:
        return statistics.median(self.tokens_per_second) if self.tokens_per_second else 0.0

    @property
    def speedup(self) -> float | None:
        """The median over request pairs: a burst of load that slows a few requests moves it little."""
        return statistics.median(self.ratios) if self.ratios else None

    @property
    def spread(self) -> tuple[float, float] | None:
        """The quartiles of the request pairs' ratios."""
        if len(self.ratios) < 2:
            return (self.ratios[0], self.ratios[0]) if self.ratios else None
        q = statistics.quantiles(self.ratios, n=4)
        return q[0], q[2]

    @property
    def pass_ratios(self) -> list[float]:
        """Per paired pass over the prompts: its tokens/s over the reference's in the same pass."""
        return [a / b for a, b in zip(self.tokens_per_second, self.reference) if a > 0 and b > 0]

    def judged(self) -> Speedup:
        """The passes' ratios as runner/speed.py judges a speedup: a round each, bounded by tau."""
        return judge(self.pass_ratios, self.tau, "paired pass", self.load)

    @property
    def tau(self) -> float | None:
        if not self.setting.drafting or not self.produced:
            return None
        return mean_acceptance_length(self.produced, self.accepted, self.requests)

    def to_dict(self) -> dict:
        return {"setting": self.setting.to_dict(), "label": self.setting.label(), "against": self.against,
                "stages": self.stages,
                "runs": len(self.tokens_per_second),
                "tokens_per_second": round(self.speed, 2),
                "tokens_per_second_runs": [round(x, 2) for x in self.tokens_per_second],
                "reference_tokens_per_second": round(statistics.median(self.reference), 2) if self.reference else None,
                "pairs": len(self.ratios),
                "speedup": None if self.speedup is None else round(self.speedup, 3),
                "speedup_quartiles": None if self.spread is None else [round(x, 3) for x in self.spread],
                "tau": None if self.tau is None else round(self.tau, 3),
                "acceptance_rate": round(self.accepted / self.drafted, 4) if self.drafted else None,
                "servers": self.servers,
                "abandoned": self.abandoned, "stalled": self.stalled, "error": self.error}


# ---------------------------------------------------------------------------------------------
# The grid
# ---------------------------------------------------------------------------------------------

def thread_grid(cpus: int) -> list[int]:
    """1..cpus; beyond 4 CPUs, the powers of two below and the count itself."""
    if cpus <= 4:
        return list(range(1, cpus + 1))
    grid, n = [], 1
    while n < cpus:
        grid.append(n)
        n *= 2
    return [*grid, cpus]


def draft_grid(longest: int) -> list[int]:
    """The coarse draft lengths: powers of two below the drafter's longest, and the longest."""
    grid, n = [], 1
    while n < longest:
        grid.append(n)
        n *= 2
    return [*grid, longest]


def midpoints(measured: Sequence[int], best: int) -> list[int]:
    """The lengths halfway between `best` and its measured neighbours, not measured yet."""
    ordered = sorted(set(measured))
    i = ordered.index(best)
    out = []
    for neighbour in (ordered[i - 1] if i > 0 else None, ordered[i + 1] if i + 1 < len(ordered) else None):
        if neighbour is not None:
            mid = (best + neighbour) // 2
            if mid not in ordered and mid not in out:
                out.append(mid)
    return out


def best_drafting(candidates: Sequence[Candidate]) -> Candidate | None:
    """The drafting candidate with the highest median speedup among those measured in full, else
    among those stopped early (a median of a few pairs says little), and last those that stalled; ties:
    more pairs, fewer threads."""
    ok = [c for c in candidates if c.setting.drafting and c.error is None and c.ratios]
    return max(ok, key=lambda c: (not c.stalled, not c.abandoned, c.speedup, len(c.ratios),
                                  -(c.setting.threads or 0)), default=None)


def controller_settings(best: Candidate | None, auto: Setting) -> list[Setting]:
    """The controller's settings to measure: `auto`, and beside it `auto` at the p_min of the best chain
    measured so far where that chain has one (the drafter's confidence cuts each block, so the
    controller chooses among lengths the drafter is sure of: docs/speed.md#the-controller-and-p_min)."""
    p_min = best.setting.p_min if best is not None and best.setting.tree_budget is None else None
    return [auto] + ([dataclasses.replace(auto, p_min=p_min)] if p_min is not None and auto.p_min is None else [])


def with_controller(best: Candidate, candidates: Sequence[Candidate]) -> Candidate:
    """The fastest of the controller's candidates instead of `best` when it measured within
    CONTROLLER_MARGIN of it."""
    auto = [c for c in candidates if c.setting.drafting and c.setting.draft_max == AUTO and c.error is None
            and c.ratios and not c.stalled and not c.abandoned]
    fastest = max(auto, key=lambda c: c.speedup, default=None)
    if fastest is not None and best is not None and best.speedup is not None \
            and fastest.speedup >= best.speedup * CONTROLLER_MARGIN:
        return fastest
    return best


def faster_alone(candidates: Sequence[Candidate]) -> Candidate | None:
    """The target alone at the thread count measured fastest against the first reference, when
    one beat it in full (no request hung); else None (the first reference stays)."""
    ok = [c for c in candidates if not c.setting.drafting and c.ratios and not c.stalled and c.speedup > 1.0]
    return max(ok, key=lambda c: (c.speedup, -(c.setting.threads or 0)), default=None)


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class TuneSettings(Settings):
    """How tune measures, checked as it is built (dflash_gguf/settings.py): the command line's
    (runner/tune_cli.py) and the benchmarks'."""

    n_predict: int = 64
    rounds: int = 3                   # paired passes over the prompts per searched setting
    confirm_rounds: int = 6           # paired passes of the best setting, fresh
    min_speedup: float = DEFAULT_MIN_SPEEDUP
    max_seconds: float | None = None  # after it, no further search stage starts; confirmation still runs
    quick: bool = False               # coarse grids only, one p_min
    backend: str | None = None
    llama_bin: Path | None = None
    server_args: Sequence[str] = ()   # the user's (after --)
    cpus: int | None = None           # the thread grid's top; default: this process's CPUs
    exact: bool = False               # serve --exact: every setting measured batch-invariant
    fresh_servers: bool = False       # each confirmation pass on a new pair of servers (runner/speed.RoundServers)

    def problems(self) -> Iterator[str]:
        refused = refusal(parse_server_args, self.server_args)
        if refused:
            yield from refused
            return
        honoured = parse_server_args(self.server_args).honoured
        if "port" in honoured:
            yield "--port after --: tune runs two servers at a time, each on a free port; leave it out"
        if "rpc" in honoured:
            yield ONE_CLIENT_PER_RPC_SERVER.format(command="tune")


@dataclass
class TuneResult:
    """What `tune --json` prints and the cache keeps (runner/tuned_settings.py)."""

    target: Path
    draft: Path
    chosen: Setting           # what serve runs: the best drafting setting, or the target alone
    drafting: Candidate       # the best drafting setting's confirmation rounds
    confirmed: Speedup        # their judgement: the figure, or why it cannot be given
    alone: Setting            # the reference: the target alone at its fastest thread count
    pays: bool
    candidates: list[Candidate]
    settings: TuneSettings
    prompts: int
    llama: dict
    draft_length: int
    seconds: float
    stopped: str
    warnings: list[str]
    finished_at: str

    @property
    def speedup(self) -> float | None:
        return self.confirmed.value

    def to_dict(self) -> dict:
        s = self.settings
        return {
            "target": str(self.target), "draft": str(self.draft),
            "chosen": self.chosen.to_dict(), "chosen_label": self.chosen.label(),
            "drafting_pays": self.pays,
            "speedup": None if self.speedup is None else round(self.speedup, 3),
            "speedup_unreliable": self.confirmed.unreliable,
            "confirmation": self.confirmed.to_dict(),
            "best_drafting": self.drafting.to_dict(),
            "target_alone": {"setting": self.alone.to_dict(), "label": self.alone.label(),
                             "tokens_per_second": self.drafting.to_dict()["reference_tokens_per_second"]},
            "candidates": [c.to_dict() for c in self.candidates],
            "settings": {"n_predict": s.n_predict, "prompts": self.prompts, "rounds": s.rounds,
                         "confirm_rounds": s.confirm_rounds, "min_speedup": s.min_speedup,
                         "max_seconds": s.max_seconds, "quick": s.quick, "fresh_servers": s.fresh_servers,
                         "server_args": list(s.server_args),
                         "draft_length": self.draft_length},
            "stopped_before": self.stopped or None,
            "llama": self.llama, "seconds": round(self.seconds, 1), "warnings": self.warnings,
            "finished_at": self.finished_at,
        }


def _ask(client: LlamaClient, ids: list[int], n_predict: int, timeout: float | None = None) -> Completion:
    return client.complete(ids, n_predict, temperature=0.0, seed=0, cache_prompt=False, timeout=timeout)


class _Tuner:
    """Runs the stages. One reference server (the target alone) stays up; each setting gets its
    own server in turn, and every pass over the prompts alternates requests between the two, so
    both are timed under the same load."""

    def __init__(self, target: Path, draft: Path, prompts: Sequence[Prompt], settings: TuneSettings,
                 progress: Progress):
        self.target, self.draft, self.texts = target, draft, list(prompts)
        self.settings, self.progress = settings, progress
        self.bin_dir = find_bin_dir(settings.backend, settings.llama_bin)
        self.user = parse_server_args(settings.server_args)
        self.prompt_ids: list[list[int]] = []
        self.candidates: dict[Setting, Candidate] = {}
        self.reference_label = ""
        self.ref_seconds: list[float] = []  # the reference's last request times (wall)
        self.started = time.monotonic()

    def _server(self, setting: Setting) -> LlamaServer:
        launch = launch_recipe(self.target, self.draft if setting.drafting else None,
                               draft_max=setting.draft_max if setting.drafting else None,
                               server_args=[*setting.server_args(), *self.settings.server_args], check=False,
                               exact=self.settings.exact)
        return measuring_launch(launch, self.texts, self.settings.n_predict).server(bin_dir=self.bin_dir)

    @contextlib.contextmanager
    def _running(self, setting: Setting) -> Iterator[LlamaServer]:
        """`setting`'s server, started and warmed up; stopped after the block, however it ends."""
        with self._server(setting) as server:
            if not self.prompt_ids:
                self.prompt_ids = tokenize_prompts(server.client, self.texts)
            # warm-up, not measured (and, like any request, not waited for when far slower than the reference's)
            _ask(server.client, self.prompt_ids[0][:8], self.settings.n_predict, timeout=self._limit())
            yield server

    def _limit(self) -> float | None:
        """How long a request may take: SLOW_FACTOR times the reference's recent ones (None: no reference yet)."""
        if not self.ref_seconds:
            return None
        return max(SLOW_MIN_SECONDS, SLOW_FACTOR * statistics.median(self.ref_seconds))

    def measure(self, reference: LlamaServer, setting: Setting, passes: int, stage: str,
                into: dict[Setting, Candidate] | None = None) -> Candidate:
        """`passes` passes over the prompts, each request to `setting`'s server next to the same
        request to the reference (which goes first alternates); its speed / the reference's per pass."""
        table = self.candidates if into is None else into
        cand = table.setdefault(setting, Candidate(setting, against=self.reference_label))
        if stage not in cand.stages:
            cand.stages.append(stage)
        if cand.error is not None:
            return cand
        try:
            with self._running(setting) as server, \
                    Stage(self.progress, f"  {setting.label()}: requests", total=2 * passes * len(self.prompt_ids)) as requests:
                cand.servers += 1
                for p in range(passes):
                    if not self._pass(reference, server, cand, p, requests):
                        cand.abandoned = True
                        break
        except ServerStartError as err:
            if not setting.drafting:
                raise
            cand.error = str(err)
            self.progress(f"  {setting.label()}: did not start ({err}); left out")
            return cand
        except ServerError as err:  # the warm-up (or a request) took far longer than the reference's
            cand.stalled = cand.abandoned = True
            self.progress(f"  {setting.label()}: stopped, no answer in time: {err}")
        if not cand.ratios:
            return cand
        tau = f", tau {cand.tau:.2f}" if cand.tau else ""
        self.progress(f"  {setting.label()}: {cand.speed:.1f} tok/s against {statistics.median(cand.reference):.1f} "
                      f"alone: {cand.speedup:.2f}x{tau} (median of {len(cand.ratios)} request pairs)")
        return cand

    def _pass(self, reference: LlamaServer, server: LlamaServer, cand: Candidate, p: int, requests: Stage) -> bool:
        """One paired pass; False when it stopped early, the setting being far slower than the reference."""
        n = self.settings.n_predict
        mine, theirs = [], []
        for i, ids in enumerate(self.prompt_ids):
            ref_first = bool((i + p) % 2) or not self.ref_seconds
            if ref_first:
                theirs.append(self._timed(reference, ids))
                requests.advance()
            # a request far slower than the reference's is not waited for: the setting is out
            limit = self._limit()
            try:
                mine.append(_ask(server.client, ids, n, timeout=limit))
                requests.advance()
            except ServerError as err:
                cand.stalled = True
                self.progress(f"  {cand.setting.label()}: stopped, no answer within {limit:.1f} s "
                              f"({SLOW_FACTOR}x the target alone's time): {err}")
                if len(theirs) > len(mine):
                    theirs.pop()
                break
            if not ref_first:
                theirs.append(self._timed(reference, ids))
                requests.advance()
            a_tps, b_tps = (ServerRun([c], [c]).tokens_per_second() for c in (mine[-1], theirs[-1]))
            if a_tps and b_tps:
                cand.ratios.append(a_tps / b_tps)
            if p == 0 and len(cand.ratios) >= ABANDON_AFTER and cand.speedup < ABANDON_BELOW:
                break
        if not mine:
            return False
        cand.tokens_per_second.append(ServerRun(mine, mine).tokens_per_second())
        cand.reference.append(ServerRun(theirs, theirs).tokens_per_second())
        cand.load = max(filter(None, (cand.load, load_average())), default=None)
        totals = ServerRun(mine, mine).totals()
        cand.produced += totals["produced"]
        cand.drafted += totals["drafted"]
        cand.accepted += totals["accepted"]
        cand.requests += len(mine)
        return len(mine) == len(self.prompt_ids)

    def _timed(self, reference: LlamaServer, ids: list[int]) -> Completion:
        started = time.monotonic()
        answer = _ask(reference.client, ids, self.settings.n_predict)
        self.ref_seconds = [*self.ref_seconds[-8:], time.monotonic() - started]
        return answer

    def probe(self, settings: Sequence[Setting]) -> Setting:
        """The fastest of `settings` in a few requests each, unpaired: a first reference that is not
        one of the far slower ones (threads fighting over busy cores)."""
        speeds: dict[Setting, float] = {}
        fastest = None  # seconds per request of the fastest so far
        for setting in settings:
            limit = max(SLOW_MIN_SECONDS, SLOW_FACTOR * fastest) if fastest else None
            self.ref_seconds = [fastest] if fastest else []  # the warm-up's limit too
            try:
                with self._running(setting) as server:
                    started = time.monotonic()
                    done = [_ask(server.client, ids, self.settings.n_predict, timeout=limit)
                            for ids in self.prompt_ids[:PROBE_REQUESTS]]
            except ServerError as err:
                if limit is None or isinstance(err, ServerStartError):
                    raise
                self.progress(f"  probe {setting.label()}: no answer within {limit:.1f} s ({err})")
                continue
            per_request = (time.monotonic() - started) / len(done)
            fastest = min(fastest or per_request, per_request)
            speeds[setting] = ServerRun(done, done).tokens_per_second()
            self.progress(f"  probe {setting.label()}: {speeds[setting]:.1f} tok/s")
        self.ref_seconds = []
        return max(speeds, key=speeds.get)

    def stage(self, reference: LlamaServer, name: str, settings: Sequence[Setting]) -> None:
        """Each of `settings` not measured yet, against `reference`."""
        settings = [x for x in dict.fromkeys(settings) if x not in self.candidates or not self.candidates[x].ratios
                    and self.candidates[x].error is None]
        if not settings:
            return
        self.progress(f"{name}: {len(settings)} setting(s), {self.settings.rounds} paired pass(es) each")
        for setting in settings:
            self.measure(reference, setting, self.settings.rounds, name)

    def as_run(self, setting: Setting) -> Setting:
        """`setting` with the values the user fixed after `--` written in: what serve must repeat."""
        def number(flags: tuple[str, ...], kind: type) -> int | float | None:
            value = self.user.value_of(flags)
            try:
                return kind(value) if value is not None else None
            except ValueError:
                return None

        threads, p_min = number(THREADS, int), number(P_MIN, float)
        tree_budget = self.user.honoured.get("tree_budget", setting.tree_budget) if setting.drafting else None
        tree_p_min = self.user.honoured.get("tree_p_min")
        return dataclasses.replace(
            setting, threads=setting.threads if threads is None else threads,
            draft_max=self.user.honoured.get("draft_max", setting.draft_max) if setting.drafting else None,
            p_min=setting.p_min if p_min is None or not setting.drafting else p_min,
            tree_budget=tree_budget,
            tree_p_min=(setting.tree_p_min if tree_p_min is None else tree_p_min) if tree_budget else None)

    def over_budget(self) -> bool:
        limit = self.settings.max_seconds
        return limit is not None and time.monotonic() - self.started > limit

    def run(self) -> tuple[Candidate, Setting, str]:
        s = self.settings
        described = read_draft(self.draft)
        longest = described.draft_length
        fixed_threads = self.user.value_of(THREADS) is not None
        threads: list[int | None] = [None] if fixed_threads else thread_grid(s.cpus or cpus())
        p_fixed = self.user.value_of(P_MIN) is not None
        floor_fixed = "tree_p_min" in self.user.honoured
        n_fixed = "draft_max" in self.user.honoured
        # a tree needs a DFlash or DFlash 2 drafter, and a length the server does not choose itself
        tree_open = "tree_budget" not in self.user.honoured and described.spec_type == "draft-dflash" \
            and self.user.honoured.get("draft_max") != AUTO

        def spec(t: int | None, n: int | None, p: float | None = None) -> Setting:
            # what the user fixed stays theirs: the launch reads it from after --
            return Setting(True, t, None if n_fixed else n, None if p_fixed else p)

        alone = Setting(False)  # llama-server's own thread count, or the user's -t
        stopped = ""
        if not fixed_threads:  # the target alone's fastest thread count becomes the reference
            first = self.probe([Setting(False, t) for t in threads])
            self.reference_label, self.ref_seconds = first.label(), []
            with self._running(first) as reference:
                self.stage(reference, "threads, target alone", [Setting(False, t) for t in threads
                                                               if t != first.threads])
            better = faster_alone(self.candidates.values())
            alone = better.setting if better is not None else first
        self.reference_label, self.ref_seconds = alone.label(), []
        self.progress(f"reference: {alone.label()}")
        with self._running(alone) as reference:
            self.stage(reference, "threads, drafter", [spec(t, longest) for t in threads])
            best = best_drafting(self.candidates.values())
            if best is None:
                errors = [c.error for c in self.candidates.values() if c.error]
                raise ServerStartError(f"{self.draft}: llama-server did not start with this drafter at any "
                                       f"thread count: {errors[0] if errors else ''}")
            t_best = best.setting.threads
            steps = ["draft length"] * (not n_fixed and longest > 1) + ["p_min"] * (not p_fixed)
            for step in steps:
                if self.over_budget():
                    stopped = step
                    break
                best = best_drafting(self.candidates.values())
                if step == "p_min":
                    grid = QUICK_P_MINS if s.quick else P_MINS
                    self.stage(reference, step, [spec(t_best, best.setting.draft_max, p) for p in grid])
                    continue
                self.stage(reference, step, [spec(t_best, n) for n in draft_grid(longest)])
                for i in range(0 if s.quick else REFINE_STEPS):  # coarse to fine, around the best
                    best = best_drafting(self.candidates.values())
                    measured = [c.setting.draft_max for c in self.candidates.values()
                                if c.setting.drafting and c.setting.threads == t_best and c.setting.p_min is None
                                and c.ratios]
                    more = midpoints(measured, best.setting.draft_max) if best.setting.threads == t_best else []
                    if not more or self.over_budget():
                        break
                    self.stage(reference, f"draft length, refine {i + 1}", [spec(t_best, n) for n in more])
            if not n_fixed and not self.over_budget():
                self.stage(reference, "controller", controller_settings(best_drafting(self.candidates.values()),
                                                                        spec(t_best, AUTO)))
            elif not n_fixed:
                stopped = stopped or "controller"
            if tree_open and not self.over_budget():
                # at the trained length: a tree verifies its budget whatever its depth, and capped at a short
                # chain's best length it cannot go deep where the drafter is sure (docs/speed.md#draft-trees)
                self.stage(reference, "draft tree", [dataclasses.replace(spec(t_best, longest), tree_budget=b)
                                                     for b in (QUICK_TREE_BUDGETS if s.quick else TREE_BUDGETS)])
                if not floor_fixed and not self.over_budget():
                    # a floor verifies fewer nodes where the drafter is unsure, as p_min shortens the chain
                    self.stage(reference, "tree floor", [
                        dataclasses.replace(spec(t_best, longest), tree_budget=TREE_FLOOR_BUDGET, tree_p_min=p)
                        for p in (QUICK_TREE_P_MINS if s.quick else TREE_P_MINS)])
                elif not floor_fixed:
                    stopped = stopped or "tree floor"
            elif tree_open:
                stopped = stopped or "draft tree"
            # fresh passes of the best: the search's best is the luckiest of many noisy estimates
            best = with_controller(best_drafting(self.candidates.values()), self.candidates.values())
            self.progress(f"confirmation: {best.setting.label()} against {alone.label()}"
                          + (", a new pair of servers each pass" if s.fresh_servers else ""))
            if not s.fresh_servers:
                return self.measure(reference, best.setting, s.confirm_rounds, "confirmation", into={}), alone, stopped
        # two server processes of one command can run several per cent apart for as long as they live
        # (docs/speed.md#fresh-servers): new ones each pass put that offset into the passes' spread
        passes: dict[Setting, Candidate] = {}
        for _ in range(s.confirm_rounds):
            with self._running(alone) as reference:
                confirmed = self.measure(reference, best.setting, 1, "confirmation", into=passes)
            if confirmed.error is not None or confirmed.abandoned or confirmed.stalled:
                break
        return confirmed, alone, stopped


def tune(target: str | Path, draft: str | Path, prompts: Sequence[Prompt], settings: TuneSettings,
         progress: Progress | None = None) -> TuneResult:
    """Measure the grid (module docstring) and choose: the best drafting setting when its confirmed
    speedup reaches `settings.min_speedup`, else the target alone at its fastest thread count."""
    progress = progress or (lambda _msg: None)
    target, draft = Path(target), Path(draft)
    # the pair's checks, before anything starts (the user's arguments were checked with the settings)
    warnings = list(launch_recipe(target, draft, server_args=settings.server_args).warnings)
    tuner = _Tuner(target, draft, prompts, settings, progress)
    with working(progress, "tune"):
        spec, alone, stopped = tuner.run()
    if stopped:
        progress(f"--max-seconds {settings.max_seconds:g} reached: skipped the search from the {stopped} stage on")
    # decided on the speedup as saved (3 decimals), so serve's verdict line, computed from the saved
    # figure, never says "pays" beside the target alone; a speedup the run cannot support never pays
    confirmed = spec.judged()
    pays = drafting_pays(None if confirmed.value is None else round(confirmed.value, 3), settings.min_speedup)
    return TuneResult(
        target=target, draft=draft, chosen=tuner.as_run(spec.setting if pays else alone), drafting=spec,
        confirmed=confirmed,
        alone=alone,
        pays=pays, candidates=list(tuner.candidates.values()), settings=settings, prompts=len(prompts),
        llama=build_info(tuner.bin_dir, settings.backend), draft_length=read_draft(draft).draft_length,
        seconds=time.monotonic() - tuner.started, stopped=stopped, warnings=warnings,
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
