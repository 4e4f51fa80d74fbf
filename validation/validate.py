"""`dflash-gguf validate`: is speculative output exactly the target's, and what does the drafter buy?

The patched llama-server runs the same prompts (as token ids) twice, with the drafter and without,
greedy, each started by the launch recipe `serve` uses (runner/launch.py) with the user's own
arguments; validate adds a context size when none is given and the debug verbosity that logs the
server's steps, and its report says so. Every token the speculative run emitted is then proven
against the batch that produced it: the target alone, in-process on the same patched libllama
with the server's context, evaluates the run's own batches again (validation/replay.py, from the
steps in the server's log, validation/server_steps.py; on recurrent, hybrid and sliding-window
targets its prompt batches, snapshots and checkpoint restores too), and each emitted token must be
its argmax there (validation/lossless.py): `proven_by_replay` counts those that are, and each one
that is not is named with why. Whether the output is also identical to the target-alone
run is reported apart, with the first difference explained. Acceptance comes from the server's
per-request `timings`. Speed is measured apart, with neither server logging its steps: the target
alone and the speculative server up together, the prompts sent to both in interleaved rounds, the
median ratio judged against tau and its own spread (runner/speed.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from dflash_gguf.extras import require
from dflash_gguf.hub import resolve as hub
from dflash_gguf.hub.resolve import HubRef
from dflash_gguf.outputs import head
from dflash_gguf.progress import stage
from dflash_gguf.settings import Settings, refusal
from dflash_gguf.runner.build import build_info, find_bin_dir
from dflash_gguf.runner.client import Completion, LlamaClient
from dflash_gguf.runner.launch import Launch, launch_recipe, with_rpc
from dflash_gguf.runner.measure import (Progress, ServerRun, acceptance_rate, first_divergence, mean_acceptance_length,
                              measuring_launch)
from dflash_gguf.runner.prompts import Prompt, size_bound, tokenize_prompts
from dflash_gguf.runner.speed import Rounds, RoundServers, Speedup, interleaved_rounds, not_measured
from .acceptance import depth_profile, limit_fields
from .draft_parity import draft_parity
from .lossless import MISMATCH, NUMERICAL, judge, noise_by_width
from .reference import run_reference
from .replay import Replay, ServerContext
from .server_steps import DEBUG_ARGS, TaskSteps, read_steps, tree_state

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ValidationSettings(Settings):
    """How validate runs: its command's options that reach the library (validate_cli.ValidateSettings adds
    the command's own). release, train and bench build it too, through the same checks."""

    n_predict: int = 64
    parallel: int | None = None          # requests in flight = llama-server slots; None: -np after --, else 1
    temperature: float = 0.0
    exact: bool = False                  # serve's --exact: the batch-invariant kernels (runner/launch.py)
    threads: int | None = None           # llama-server -t
    backend: str | None = None           # which patched build (or llama_bin: any build's bin folder)
    llama_bin: Path | None = None
    server_args: Sequence[str] = field(default_factory=list)  # the user's llama-server arguments (after --)
    reference_draft: Path | HubRef | None = None  # z-lab HF checkpoints (or repo ids): run the PyTorch reference too
    reference_target: Path | HubRef | None = None
    rounds: int = 3                      # interleaved speed rounds (runner/speed.py); 0: speed not measured
    fresh_servers: bool = False          # a new pair of servers for each round (runner/speed.RoundServers)
    speed_prompts: int | None = None     # the rounds send the first this many prompts (None: all)
    rpc: str | None = None               # --rpc: the target over rpc-servers (folded into the server arguments)

    def problems(self) -> Iterator[str]:
        if self.temperature == 0 and (self.reference_draft is None) != (self.reference_target is None):
            yield "--reference-draft and --reference-target go together"
        if self.temperature == 0 and self.reference_draft is not None:
            yield from refusal(require, "reference", "--reference-draft")
        yield from refusal(with_rpc, self.rpc, self.server_args)

    def user_server_args(self) -> list[str]:
        return (["-t", str(self.threads)] if self.threads else []) + list(with_rpc(self.rpc, self.server_args))


def _reference_parity(settings: ValidationSettings, prompt_ids: list[list[int]], spec: ServerRun,
                      spec_tasks: list[TaskSteps], progress: Progress) -> dict | None:
    if settings.reference_draft is None:
        return None

    progress("reference: running the z-lab PyTorch drafter on the same token ids")
    runs = run_reference(settings.reference_draft, settings.reference_target, prompt_ids, settings.n_predict)
    steps = sum(len(r.acceptance_lengths) for r in runs)
    tau = sum(sum(r.acceptance_lengths) for r in runs) / steps if steps else 0.0
    progress("reference: drafting every block llama.cpp drafted, at the same context, in float32 and with float16 weights")
    parity = draft_parity(settings.reference_draft, settings.reference_target, prompt_ids,
                          [c.tokens for c in spec.sequential], [task.steps for task in spec_tasks])
    return {"mean_acceptance_length": round(tau, 4), "draft": str(settings.reference_draft),
            "target": str(settings.reference_target),
            "prompts": [{"tokens": len(r.tokens), "mean_acceptance_length": round(r.tau, 4)} for r in runs],
            "draft_parity": parity}


def run_server(launch: Launch, prompts: list[list[int]] | Sequence[Prompt], settings: ValidationSettings,
                bin_dir: Path, label: str, progress: Progress, log_path: Path | None = None
                ) -> tuple[ServerRun, list[list[int]], list[str]]:
    """Answer every prompt; prompts not yet token ids are tokenized by this server first (returned
    with the run), and so is the command line the server ran. `log_path` keeps the server's log there."""
    def ask(client: LlamaClient, ids: list[int]) -> Completion:
        return client.complete(ids, settings.n_predict, temperature=settings.temperature, seed=0, cache_prompt=False)

    with launch.server(bin_dir=bin_dir, log_path=log_path) as server:
        client = server.client
        if prompts and not isinstance(prompts[0], list):
            prompts = tokenize_prompts(client, prompts)
        progress(f"{label}: server up at {client.url}; {len(prompts)} prompts, {launch.parallel} in flight")
        sequential_too = launch.parallel != 1
        with stage(progress, f"{label}: prompts answered", total=len(prompts) * (1 + sequential_too)) as answered:
            def answer(ids: list[int]) -> Completion:
                completion = ask(client, ids)
                answered.advance()
                return completion

            ask(client, prompts[0][:8])  # warm-up, not measured
            pool = ThreadPoolExecutor(max_workers=launch.parallel)
            try:
                completions = list(pool.map(answer, prompts))
            finally:
                # on Ctrl-C or SIGTERM, do not wait for the requests in flight: stopping the server ends them
                pool.shutdown(wait=False, cancel_futures=True)
            sequential = [answer(ids) for ids in prompts] if sequential_too else completions
        command = server.command()
        progress(f"{label}: done")
    return ServerRun(completions, sequential), prompts, command


def measure_speed(speed_launch: Launch, target: Path, prompt_ids: list[list[int]], settings: ValidationSettings,
                  bin_dir: Path, progress: Progress) -> tuple[Rounds | None, Speedup]:
    """The target alone and `speed_launch` up together, `settings.rounds` interleaved rounds over the
    prompts (one request at a time), judged against the rounds' own tau."""
    if settings.rounds == 0:
        return None, not_measured("not measured (rounds 0)")
    prompt_ids = prompt_ids[:settings.speed_prompts or len(prompt_ids)]
    if speed_launch.rpc:
        return None, not_measured("the target is spread over --rpc servers, which serve one llama-server at a "
                                  "time, so the target alone and the speculative server cannot take turns")
    progress(f"speed: the target alone and the speculative server up together, {settings.rounds} interleaved "
             f"round(s) over {len(prompt_ids)} prompt(s)" + (", a new pair of servers each round" if settings.fresh_servers else ""))

    def ask(client: LlamaClient, ids) -> Completion:
        return client.complete(ids, settings.n_predict, temperature=settings.temperature, seed=0,
                               cache_prompt=False)

    makers = {"alone": lambda: speed_launch.alone(target).server(bin_dir=bin_dir),
              "speculative": lambda: speed_launch.server(bin_dir=bin_dir)}
    with RoundServers(makers, settings.fresh_servers, lambda server: ask(server.client, prompt_ids[0][:8])) as servers:
        rounds = interleaved_rounds(lambda r: tuple(s.client for s in servers.servers(r).values()), prompt_ids, ask,
                                    settings.rounds, progress)
        rounds.server_pairs = servers.started
    totals = ServerRun(rounds.answers, rounds.answers).totals()
    tau = mean_acceptance_length(totals["produced"], totals["accepted"], len(rounds.answers))
    return rounds, rounds.speedup(tau)  # 1.0 when nothing was drafted: a plain step's token per step


def _replayed(model: Path, contexts: list[ServerContext], bin_dir: Path, jobs: list, progress: Progress) -> list[list]:
    """Each job list run on a Replay of `model` with its context (one load where the contexts agree)."""
    results: list[list] = [[] for _ in contexts]
    with stage(progress, "replay: prompts replayed", total=sum(map(len, jobs))) as replayed:
        def run(job, replay):
            row = job(replay)
            replayed.advance()
            return row

        for context in dict.fromkeys(contexts):
            with Replay(model, context, bin_dir=bin_dir) as replay:
                for n, c in enumerate(contexts):
                    if c == context:
                        results[n] = [run(job, replay) for job in jobs[n]]
    return results


def _check_tokens(spec: ServerRun, alone: ServerRun, prompt_ids: list[list[int]], tasks: dict[str, list[TaskSteps]],
                  contexts: list[ServerContext], model: Path, bin_dir: Path, progress: Progress) -> tuple[list, dict]:
    """Replay the one-at-a-time speculative pass batch by batch on `model` alone, and plain decoding
    of the target-alone pass, each with its server's context (`contexts`: the speculative run's, the
    target alone's) and prompt batches; judge every token. The judgements per prompt, and what the
    replay was."""
    progress(f"replaying every verify batch of the speculative run on {model.name} alone")
    spec_jobs = [lambda r, ids=ids, c=c, task=task: r.run(ids, c.tokens, task.steps, task.prompt_batches, task.tokens)
                 for ids, c, task in zip(prompt_ids, spec.sequential, tasks["speculative"])]
    plain_jobs = [lambda r, ids=ids, c=c, task=task: r.plain(ids, c.tokens, task.prompt_batches)
                  for ids, c, task in zip(prompt_ids, alone.sequential, tasks["alone"])]
    spec_rows, plain_rows = _replayed(model, contexts, bin_dir, [spec_jobs, plain_jobs], progress)
    noise: dict[int, float] = {}
    for s, t, rows, plain in zip(spec.sequential, alone.sequential, spec_rows, plain_rows):
        agree = first_divergence(s.tokens, t.tokens)
        noise_by_width(rows, plain, len(rows) if agree is None else agree, noise)
    reproduced = sum(sum(r.margin == 0 for r in plain) for plain in plain_rows)
    alone_tokens = sum(len(t.tokens) for t in alone.sequential)
    exact = reproduced == alone_tokens
    tolerance = 0.0 if exact else max(noise.values(), default=0.0)
    judgements = [judge(s.tokens, t.tokens, rows, plain, tolerance)
                  for s, t, rows, plain in zip(spec.sequential, alone.sequential, spec_rows, plain_rows)]
    replay_info = {
        "exact": exact, "alone_tokens": alone_tokens, "alone_tokens_reproduced": reproduced,
        "tolerance": round(tolerance, 6),
        "tolerance_source": "none needed: the replay reproduced every token of the target-alone run" if exact else
        "the replay did not reproduce the target-alone run; margins up to the largest batching noise "
        "measured in this run (noise_by_width) count as numerical",
        "noise_by_width": {str(w): round(v, 6) for w, v in sorted(noise.items())},
        "restores": sum(task.restores for task in tasks["speculative"]),
        "context": dataclasses.asdict(contexts[0]), "model": str(model),
    }
    return judgements, replay_info


@dataclass(frozen=True)
class PromptResult:
    """One prompt of a greedy validation (a row of the report's `prompts`)."""
    prompt: str
    exact: bool  # its tokens equal the target alone's
    lossless: bool  # no emitted token the target did not choose in its batch
    tokens: int  # the target alone's
    produced: int  # the speculative run's
    positions_checked: int
    proven_by_replay: int
    not_proven: list[dict]  # position, token and why, per token not proven
    first_divergence: int | None  # from the target alone's tokens
    numerical: int
    mismatches: int
    draft_n: int
    draft_n_accepted: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ValidationReport:
    """A greedy validation; `to_dict()` is the JSON `--json` prints and `--report` writes."""
    prompts: list[PromptResult]
    mean_acceptance_length: float
    acceptance_rate: float
    drafted: int
    accepted: int
    produced: int
    proven_by_replay: int
    positions_checked: int
    tokens_per_second: dict[str, float]  # target, speculative: the median round's
    speedup: float | None  # None when not measured reliably (speed["speedup_unreliable"] says why)
    speed: dict  # runner/speed.Speedup.to_dict(): the rounds, their range, the bound, the load
    divergences: list[dict]  # every mismatch and numerical difference (lossless.py Finding.to_dict)
    replay: dict  # what the replay was and reproduced (_check_tokens)
    settings: dict
    launch: dict  # serve's recipe, the user's arguments after --, what validate added, both commands
    llama: dict
    reference: dict | None  # the z-lab PyTorch reference's tau and the draft parity, when asked
    drafting: dict  # validation/acceptance.py depth_profile of the one-at-a-time pass: lengths, parked, per depth
    warnings: list[str]
    finished_at: str

    @property
    def exact(self) -> bool:
        return all(p.exact for p in self.prompts)

    @property
    def lossless(self) -> bool:
        return all(p.lossless for p in self.prompts)

    def to_dict(self) -> dict:
        fields = {}
        for f in dataclasses.fields(self):
            fields[f.name] = getattr(self, f.name)
            if f.name == "speedup":  # beside it, why it is null when it is
                fields["speedup_unreliable"] = self.speed.get("speedup_unreliable")
        return {"exact": self.exact, "lossless": self.lossless, **fields,
                "prompts": [p.to_dict() for p in self.prompts]}


def validate(target: str | Path, draft: str | Path, prompts: Sequence[Prompt], settings: ValidationSettings,
             baseline: str | Path | None = None, progress: Progress | None = None) -> ValidationReport:
    """Run both servers and build the report."""
    progress = progress or (lambda msg: log.info(msg))
    target, draft = Path(target), Path(draft)
    baseline = Path(baseline) if baseline else target
    if settings.reference_draft is not None:  # fetched before the servers run, so a Hub error comes first
        settings = dataclasses.replace(settings, reference_draft=hub.drafter_folder(settings.reference_draft),
                                       reference_target=hub.target_folder(settings.reference_target, weights=True))
    speed_launch = measuring_launch(launch_recipe(target, draft, parallel=settings.parallel, exact=settings.exact,
                                                  server_args=settings.user_server_args()),
                                    prompts, settings.n_predict)
    launch = speed_launch.adding(*DEBUG_ARGS)
    bin_dir = find_bin_dir(settings.backend, settings.llama_bin)
    n_ctx = max(size_bound(p) for p in prompts) + settings.n_predict + 64
    with tempfile.TemporaryDirectory(prefix="dflash-validate-") as folder:
        logs = {run: Path(folder) / f"{run}.log" for run in ("speculative", "alone")}
        spec, prompt_ids, spec_command = run_server(launch, list(prompts), settings, bin_dir, "speculative",
                                                    progress, log_path=logs["speculative"])
        alone, _, alone_command = run_server(launch.alone(baseline), prompt_ids, settings, bin_dir, "target alone",
                                              progress, log_path=logs["alone"])
        # the last requests of each log are its one-at-a-time pass
        tasks = {run: read_steps(logs[run])[-len(prompt_ids):] for run in logs}
        commands = {"speculative": spec_command, "alone": alone_command}
        contexts = [ServerContext.from_args(commands[run][1:], n_ctx * launch.parallel, launch.exact).as_logged(logs[run])
                    for run in ("speculative", "alone")]
        judgements, replay_info = _check_tokens(spec, alone, prompt_ids, tasks, contexts, baseline, bin_dir, progress)
        replay_info["tree"] = tree_state(logs["speculative"])
        replay_info["tree_steps"] = sum(step.is_tree for task in tasks["speculative"] for step in task.steps)

    results, divergences = [], []
    for text, s, seq, t, j in zip(prompts, spec.completions, spec.sequential, alone.completions, judgements):
        # in flight together (-np > 1), a prompt's tokens are proven when they are the one-at-a-time pass's
        checked = j.checked if s.tokens == seq.tokens else min(j.checked, first_divergence(s.tokens, seq.tokens))
        not_proven = j.not_proven(s.tokens, checked)
        results.append(PromptResult(
            prompt=str(text), exact=s.tokens == t.tokens, lossless=not j.mismatches, tokens=len(t.tokens),
            produced=s.n_predicted, positions_checked=checked, proven_by_replay=len(s.tokens) - len(not_proven),
            not_proven=not_proven, first_divergence=first_divergence(s.tokens, t.tokens), numerical=j.numerical,
            mismatches=j.mismatches, draft_n=s.draft_n, draft_n_accepted=s.draft_n_accepted))
        divergences += [{"prompt": str(text), **f.to_dict()} for f in j.findings]

    totals = spec.totals()
    reference = _reference_parity(settings, prompt_ids, spec, tasks["speculative"], progress)
    rounds, speedup = measure_speed(speed_launch, target, prompt_ids, settings, bin_dir, progress)
    return ValidationReport(
        prompts=results,
        mean_acceptance_length=round(mean_acceptance_length(totals["produced"], totals["accepted"],
                                                            len(prompt_ids)), 4),
        acceptance_rate=round(acceptance_rate(totals["drafted"], totals["accepted"]), 4),
        drafted=totals["drafted"], accepted=totals["accepted"], produced=totals["produced"],
        proven_by_replay=sum(r.proven_by_replay for r in results),
        positions_checked=sum(r.positions_checked for r in results),
        tokens_per_second=rounds.tokens_per_second() if rounds else {"target": 0.0, "speculative": 0.0},
        speedup=speedup.to_dict()["speedup"],
        speed={**speedup.to_dict(), "rounds": settings.rounds, "server_pairs": rounds.server_pairs if rounds else 0,
               "prompts": len(rounds.answers) // max(settings.rounds, 1) if rounds else 0,
               **limit_fields((c.timings for c in rounds.answers) if rounds else (), speedup.to_dict()["speedup"],
                              launch.parallel),
               "tokens_per_second_rounds": {"target": rounds.alone, "speculative": rounds.speculative}
               if rounds else None},
        divergences=divergences,
        replay=replay_info,
        settings={"n_predict": settings.n_predict, "parallel": launch.parallel, "exact": settings.exact,
                  "rounds": settings.rounds, "fresh_servers": settings.fresh_servers,
                  "temperature": settings.temperature, "draft_max": launch.draft_setting,
                  "tree_budget": launch.tree_budget, "tree_p_min": launch.tree_p_min, "baseline": str(baseline)},
        launch={**launch.summary(), "speculative_command": spec_command, "target_command": alone_command},
        llama=build_info(bin_dir, settings.backend),
        reference=reference,
        drafting=depth_profile(step for task in tasks["speculative"] for step in task.steps),
        warnings=list(launch.warnings),
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


REPORT_KEYS = ("prompts", "mean_acceptance_length")
REPORT_KINDS = ("divergences", "distribution")  # greedy, or --temperature (validation/validate_sampled.py)
_REPORT_MAX_BYTES = 256 << 20


def is_report(path: Path) -> bool:
    """Whether `path` holds a report `validate --json` wrote (what a new report may replace)."""
    text = head(path, _REPORT_MAX_BYTES + 1)  # a regular file's bytes; b"" for a FIFO or device
    if len(text) > _REPORT_MAX_BYTES:
        return False
    try:
        data = json.loads(text)
    except ValueError:
        return False
    return (isinstance(data, dict) and all(key in data for key in REPORT_KEYS)
            and any(key in data for key in REPORT_KINDS))


def verdict(report: ValidationReport, strict: bool) -> int:
    """Exit status: 0 when every emitted token was checked and is the target's choice in its batch
    (lossless; with `strict`, also identical to the target alone), 1 otherwise."""
    kinds = {d["kind"] for d in report.divergences}
    if MISMATCH in kinds or (strict and (NUMERICAL in kinds or not report.exact)):
        return 1
    return 0 if report.positions_checked == report.produced else 1
