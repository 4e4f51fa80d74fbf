"""`dflash-gguf validate`: is speculative output exactly the target's, and what does the drafter buy?

The patched llama-server runs the same prompts (as token ids) twice, with the drafter and without,
greedy, each started by the launch recipe `serve` uses (runner/launch.py) with the user's own
arguments; validate adds only a context size when none is given, and its report says so. Every
token the speculative run emitted is then checked against the target's own logits at its position
(one teacher-forced pass, in-process through llama-cpp-python on the same patched libllama): the
argmax passes, a token within the tie tolerance of it is a floating-point near-tie, anything else a
mismatch. Acceptance comes from the server's per-request `timings`; speed from a
sequential pass of each server on the same build and prompts.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..convert import hub
from ..convert.hub import HubRef
from . import compare
from .build import find_bin_dir
from .client import Completion, LlamaClient
from .launch import CTX_SIZE, Launch, launch_recipe
from .prompts import Prompt, size_bound, tokenize_prompts
from .teacher_forcing import TeacherForcing

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


@dataclass
class ServerRun:
    """One server's answers to every prompt: in flight together (-np P) and, for speed, one by one."""

    completions: list[Completion]
    sequential: list[Completion]

    def totals(self) -> dict:
        produced = sum(c.n_predicted for c in self.completions)
        drafted = sum(c.draft_n for c in self.completions)
        accepted = sum(c.draft_n_accepted for c in self.completions)
        return {"produced": produced, "drafted": drafted, "accepted": accepted}

    def tokens_per_second(self) -> float:
        tokens = sum(c.n_predicted for c in self.sequential)
        ms = sum(float(c.timings.get("predicted_ms", 0.0)) for c in self.sequential)
        return tokens / (ms / 1000.0) if ms > 0 else 0.0


@dataclass
class ValidationSettings:
    n_predict: int = 64
    parallel: int | None = None          # requests in flight = llama-server slots; None: -np after --, else 1
    temperature: float = 0.0
    tie_tolerance: float = compare.DEFAULT_TIE_TOLERANCE
    threads: int | None = None           # llama-server -t
    backend: str | None = None           # which patched build (or llama_bin: any build's bin folder)
    llama_bin: Path | None = None
    server_args: list[str] = field(default_factory=list)  # the user's llama-server arguments (after --)
    reference_draft: Path | HubRef | None = None  # z-lab HF checkpoints (or repo ids): run the PyTorch reference too
    reference_target: Path | HubRef | None = None

    def user_server_args(self) -> list[str]:
        return (["-t", str(self.threads)] if self.threads else []) + [str(a) for a in self.server_args]


def _reference_parity(settings: ValidationSettings, prompt_ids: list[list[int]], progress: Progress) -> dict | None:
    if settings.reference_draft is None:
        return None
    from .reference import run_reference

    progress("reference: running the z-lab PyTorch drafter on the same token ids")
    runs = run_reference(settings.reference_draft, settings.reference_target, prompt_ids, settings.n_predict)
    steps = sum(len(r.acceptance_lengths) for r in runs)
    tau = sum(sum(r.acceptance_lengths) for r in runs) / steps if steps else 0.0
    return {"mean_acceptance_length": round(tau, 4), "draft": str(settings.reference_draft),
            "target": str(settings.reference_target),
            "prompts": [{"tokens": len(r.tokens), "mean_acceptance_length": round(r.tau, 4)} for r in runs]}


def measuring_launch(launch: Launch, prompts: Sequence[Prompt], n_predict: int) -> Launch:
    """What measuring adds to the recipe: room in every slot for the longest prompt (a generous
    bound: its bytes) and the new tokens, unless the user's arguments set the context size."""
    if launch.user_value(CTX_SIZE) is not None:
        return launch
    per_slot = max(size_bound(p) for p in prompts) + n_predict + 64
    return launch.adding("-c", str(per_slot * launch.parallel))


def run_server(launch: Launch, prompts: list[list[int]] | Sequence[Prompt], settings: ValidationSettings,
                bin_dir: Path, label: str, progress: Progress) -> tuple[ServerRun, list[list[int]], list[str]]:
    """Answer every prompt; prompts not yet token ids are tokenized by this server first (returned with the run),
    and so is the command line the server ran."""
    def ask(client: LlamaClient, ids: list[int]) -> Completion:
        return client.complete(ids, settings.n_predict, temperature=settings.temperature, seed=0, cache_prompt=False)

    with launch.server(bin_dir=bin_dir) as server:
        client = server.client
        if prompts and not isinstance(prompts[0], list):
            prompts = tokenize_prompts(client, prompts)
        progress(f"{label}: server up at {client.url}; {len(prompts)} prompts, {launch.parallel} in flight")
        ask(client, prompts[0][:8])  # warm-up, not measured
        pool = ThreadPoolExecutor(max_workers=launch.parallel)
        try:
            completions = list(pool.map(lambda ids: ask(client, ids), prompts))
        finally:
            # on Ctrl-C or SIGTERM, do not wait for the requests in flight: stopping the server ends them
            pool.shutdown(wait=False, cancel_futures=True)
        sequential = completions if launch.parallel == 1 else [ask(client, ids) for ids in prompts]
        command = server.command()
        progress(f"{label}: done")
    return ServerRun(completions, sequential), prompts, command


def build_info(bin_dir: Path, backend: str | None) -> dict:
    """Which patched build ran: backend, build key, bin folder."""
    manifest = bin_dir.parent / "build.json"
    build = json.loads(manifest.read_text()) if manifest.is_file() else {}
    return {"backend": build.get("backend", backend), "build": build.get("key", bin_dir.parent.name),
            "bin": str(bin_dir)}


def validate(target: str | Path, draft: str | Path, prompts: Sequence[Prompt], settings: ValidationSettings,
             baseline: str | Path | None = None, progress: Progress | None = None) -> dict:
    """Run both servers and build the report (the JSON `--json` prints and `--report` writes)."""
    progress = progress or (lambda msg: log.info(msg))
    target, draft = Path(target), Path(draft)
    baseline = Path(baseline) if baseline else target
    if settings.reference_draft is not None:  # fetched before the servers run, so a Hub error comes first
        settings = dataclasses.replace(settings, reference_draft=hub.drafter_folder(settings.reference_draft),
                                       reference_target=hub.target_folder(settings.reference_target, weights=True))
    launch = measuring_launch(launch_recipe(target, draft, parallel=settings.parallel,
                                            server_args=settings.user_server_args()),
                              prompts, settings.n_predict)
    bin_dir = find_bin_dir(settings.backend, settings.llama_bin)
    spec, prompt_ids, spec_command = run_server(launch, list(prompts), settings, bin_dir, "speculative", progress)
    alone, _, alone_command = run_server(launch.alone(baseline), prompt_ids, settings, bin_dir, "target alone",
                                          progress)

    results, divergences = [], []
    n_ctx = max(len(ids) for ids in prompt_ids) + settings.n_predict + 1
    with TeacherForcing(baseline, n_ctx, bin_dir=bin_dir, threads=settings.threads) as forced:
        progress(f"checking every emitted token against {baseline.name}'s own logits (teacher-forced)")
        for text, ids, s, t in zip(prompts, prompt_ids, spec.completions, alone.completions):
            findings = forced.check(ids, s.tokens, settings.tie_tolerance)
            kinds = [f.kind for f in findings]
            results.append({"prompt": str(text), "exact": s.tokens == t.tokens, "tokens": len(t.tokens),
                            "produced": s.n_predicted, "positions_checked": len(s.tokens),
                            "first_divergence": compare.first_divergence(s.tokens, t.tokens),
                            "ties": kinds.count(compare.TIE), "mismatches": kinds.count(compare.MISMATCH),
                            "draft_n": s.draft_n, "draft_n_accepted": s.draft_n_accepted})
            divergences += [{"prompt": str(text), **f.to_dict()} for f in findings]

    totals = spec.totals()
    reference = _reference_parity(settings, prompt_ids, progress)
    tps_target, tps_spec = alone.tokens_per_second(), spec.tokens_per_second()
    return {
        "exact": all(r["exact"] for r in results),
        "prompts": results,
        "mean_acceptance_length": round(compare.mean_acceptance_length(
            totals["produced"], totals["accepted"], len(prompt_ids)), 4),
        "acceptance_rate": round(compare.acceptance_rate(totals["drafted"], totals["accepted"]), 4),
        "drafted": totals["drafted"], "accepted": totals["accepted"], "produced": totals["produced"],
        "positions_checked": sum(r["positions_checked"] for r in results),
        "tokens_per_second": {"target": round(tps_target, 2), "speculative": round(tps_spec, 2)},
        "speedup": round(tps_spec / tps_target, 3) if tps_target else None,
        "divergences": divergences,
        "settings": {"n_predict": settings.n_predict, "parallel": launch.parallel,
                     "temperature": settings.temperature, "tie_tolerance": settings.tie_tolerance,
                     "draft_max": launch.draft_length, "baseline": str(baseline)},
        # serve's recipe, the user's arguments after --, and what validate added for measuring
        "launch": {**launch.summary(), "speculative_command": spec_command, "target_command": alone_command},
        "llama": build_info(bin_dir, settings.backend),
        "reference": reference,
        "warnings": list(launch.warnings),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


REPORT_KEYS = ("prompts", "mean_acceptance_length")
REPORT_KINDS = ("divergences", "distribution")  # greedy, or --temperature (runner/validate_sampled.py)
_REPORT_MAX_BYTES = 256 << 20


def is_report(path: Path) -> bool:
    """Whether `path` holds a report `validate --json` wrote (what a new report may replace)."""
    try:
        if path.stat().st_size > _REPORT_MAX_BYTES:
            return False
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(data, dict) and all(key in data for key in REPORT_KEYS)
            and any(key in data for key in REPORT_KINDS))


def verdict(report: dict, strict: bool) -> int:
    """Exit status: 0 when every emitted token was checked and is the target's (ties allowed unless
    strict), 1 otherwise."""
    kinds = {d["kind"] for d in report["divergences"]}
    if compare.MISMATCH in kinds or (strict and compare.TIE in kinds):
        return 1
    return 0 if report.get("positions_checked") == report.get("produced") else 1
