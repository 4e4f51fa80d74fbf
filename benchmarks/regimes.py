"""Section (f) of `make bench`: the same drafters on a compute-bound and a memory-bound target.

The trained target (11 MiB) decodes from the CPU caches: one verification of a block costs several
of its own tokens, so drafting barely pays. `memory_bound.widen_ffn` makes the same function
stream ~457 MiB per token, the regime of a real model, where a token is priced by reading the
weights and a verification costs far fewer tokens (llama-bench's batch against single-token times
give the ceiling on efficiency each target allows on this machine).
Each target is measured at F16 and Q8_0 (quantized by the patched llama-quantize), each drafter
`repeats` times with `validate` (target alone and speculative side by side in one run), and the
memory-bound targets are first proven to give the original's tokens (`validate --baseline`).
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from typing import Callable

from benchmarks.memory_bound import n_ff_for_size, widen_ffn
from dflash_gguf.runner.speed_verdict import batch_cost_verdict, speed_verdict

MEMORY_BOUND_MIB = 457
TARGET_TYPES = ("F16", "Q8_0")
REGIMES = ("compute-bound", "memory-bound")
# both runs of a validate read weights loaded into memory, not pages mmap may have to read back from disk
SERVER_ARGS = ["--load-mode", "none"]


def _quantize_target(src: Path, out: Path, qtype: str, backend: str) -> Path:
    from dflash_gguf.runner.build import runtime_env
    from dflash_gguf.quantize.quantize import find_llama_quantize

    exe = find_llama_quantize(backend=backend)
    tmp = out.with_name(f".{out.name}.partial")
    proc = subprocess.run([str(exe), str(src), str(tmp), qtype], capture_output=True, text=True,
                          env=runtime_env(exe.parent))
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama-quantize {src} {qtype} failed: {proc.stderr[-500:]}")
    tmp.replace(out)
    return out


def memory_bound_target(original: Path, work: Path) -> Path:
    """`original` widened to ~MEMORY_BOUND_MIB by inert FFN units, made once under `work`."""
    work.mkdir(parents=True, exist_ok=True)
    wide = work / "target-memory-bound-F16.gguf"
    if not wide.is_file():
        widen_ffn(original, wide, n_ff_for_size(original, MEMORY_BOUND_MIB))
    return wide


def targets(original: Path, work: Path, backend: str) -> dict[tuple[str, str], Path]:
    """(regime, type) -> target GGUF, made once under `work`."""
    wide = memory_bound_target(original, work)
    out = {("compute-bound", "F16"): original, ("memory-bound", "F16"): wide}
    for regime in REGIMES:
        for qtype in TARGET_TYPES[1:]:
            path = work / f"target-{regime}-{qtype}.gguf"
            if not path.is_file():
                _quantize_target(out[(regime, "F16")], path, qtype, backend)
            out[(regime, qtype)] = path
    return out


def _settings(n_predict: int, backend: str):
    from dflash_gguf.validation.validate import ValidationSettings

    return ValidationSettings(n_predict=n_predict, parallel=1, backend=backend, server_args=list(SERVER_ARGS))


def regime_section(models, n_predict: int, repeats: int, work: Path, validate_row: Callable[[dict], dict],
                   profile: Callable, progress: Callable[[str], None], backend: str = "cpu",
                   llama_bench: Callable[[Path, list[int]], dict] | None = None) -> dict:
    """Rows per (regime, type, drafter): target and speculative tok/s, speedup (median of `repeats`
    runs and their range), tau, efficiency = speedup / tau, and the ceiling on that efficiency
    (`llama_bench(target, batches)`: what one verification of the drafter's block costs in target
    tokens, drafting and overhead left out); the proof that the memory-bound targets keep the
    original's tokens; and the step decomposition of each regime at F16."""
    from dflash_gguf.runner.launch import read_draft
    from dflash_gguf.validation.validate import validate

    paths = targets(models.target, work, backend)
    proofs = []
    for qtype in TARGET_TYPES:
        wide, original = paths[("memory-bound", qtype)], paths[("compute-bound", qtype)]
        drafter = next(iter(models.drafters))
        progress(f"(f) memory-bound {qtype}: tokens against the original target (validate --baseline)")
        report = validate(wide, models.drafters[drafter], models.prompts, _settings(n_predict, backend), baseline=original,
                          progress=lambda m: progress("    " + m))
        proofs.append({"type": qtype, "drafter": drafter, "exact": report["exact"],
                       "divergences": [d["kind"] for d in report["divergences"]],
                       "tokens": report["produced"]})
    blocks = {drafter: read_draft(draft).block_size for drafter, draft in models.drafters.items()}
    rows = []
    for (regime, qtype), target in paths.items():
        bench = {}
        if llama_bench is not None:
            progress(f"(f) {regime} {qtype}: llama-bench, one token and batches of {sorted(set(blocks.values()))}")
            bench = llama_bench(target, sorted(set(blocks.values())))
        for drafter, draft in models.drafters.items():
            progress(f"(f) {regime} {qtype} target ({target.stat().st_size / 2**20:.0f} MiB), {drafter}: "
                     f"validate x{repeats}")
            runs = [validate_row(validate(target, draft, models.prompts, _settings(n_predict, backend),
                                          progress=lambda m: progress("    " + m))) for _ in range(repeats)]
            speedups = sorted(r["speedup"] or 0.0 for r in runs)
            median = runs[[r["speedup"] or 0.0 for r in runs].index(speedups[len(speedups) // 2])]
            rows.append({"regime": regime, "type": qtype, "drafter": drafter,
                         "target_mib": round(target.stat().st_size / 2**20, 1),
                         "exact": all(r["exact"] for r in runs),
                         "divergences": max((r["divergences"] for r in runs), key=len), "tau": median["tau"],
                         "tps_target": median["tps_target"], "tps_speculative": median["tps_speculative"],
                         "speedup": median["speedup"], "speedup_runs": speedups,
                         "efficiency": round(median["speedup"] / median["tau"], 3) if median["tau"] else None,
                         "block": blocks[drafter], **_ceiling(bench, blocks[drafter])})
            r = rows[-1]
            progress(f"(f) -> {r['tps_target']:.1f} -> {r['tps_speculative']:.1f} tok/s, {r['speedup']}x, "
                     f"tau {r['tau']:.2f}, efficiency {r['efficiency']}")
    steps = []
    for regime in REGIMES:
        progress(f"(f) {regime} F16: where a step's time goes")
        prof, _ = profile(dataclasses.replace(models, target=paths[(regime, "F16")]))
        steps += [{"regime": regime, **p} for p in prof]
    return {"rows": rows, "proofs": proofs, "steps": steps, "repeats": repeats, "n_predict": n_predict,
            "server_args": SERVER_ARGS}


def _ceiling(bench: dict, block: int) -> dict:
    """A verification of `block` tokens in units of one decoded token (llama-bench, target alone),
    and the efficiency it allows: 1 / that, were drafting and every overhead free."""
    if not bench.get("tg") or not bench.get(block):
        return {"verify_tokens": None, "ceiling": None}
    verify = bench[block] / bench["tg"]
    return {"verify_tokens": round(verify, 2), "ceiling": round(1.0 / verify, 2)}


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _exactness(divergences: list[str]) -> str:
    if "mismatch" in divergences:
        return "NO"
    return f"yes, {len(divergences)} tie(s)" if divergences else "yes"


def regime_table(section: dict, labels: dict[str, str]) -> str:
    header = ["target", "type", "MiB", "drafter", "exact", "tau", "target tok/s", "spec tok/s",
              "speedup (range)", "efficiency", "verify / token", "ceiling"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in section["rows"]:
        runs = r["speedup_runs"]
        lines.append("| " + " | ".join([
            r["regime"], r["type"], f"{r['target_mib']:.0f}", labels[r["drafter"]], _exactness(r["divergences"]),
            f"{r['tau']:.2f}", f"{r['tps_target']:.1f}", f"{r['tps_speculative']:.1f}",
            f"{r['speedup']:.2f}x ({runs[0]:.2f}-{runs[-1]:.2f})", f"{r['efficiency']:.2f}",
            _num(r.get("verify_tokens")), _num(r.get("ceiling"))]) + " |")
    return "\n".join(lines)


def step_table(section: dict, labels: dict[str, str]) -> str:
    header = ["target", "drafter", "target ms/token", "tau", "draft ms/step", "verify+sample ms/step",
              "draft / target token", "verify / target token", "step / target token"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in section["steps"]:
        lines.append("| " + " | ".join([
            r["regime"], labels[r["drafter"]], f"{r['target_ms_per_token']:.2f}", f"{r['tau']:.2f}",
            f"{r['draft_ms_per_step']:.2f}", f"{r['verify_ms_per_step']:.2f}", f"{r['draft_over_token']:.2f}",
            f"{r['verify_over_token']:.2f}", f"{r['step_over_token']:.2f}"]) + " |")
    return "\n".join(lines)


def _verdict(regime: str, row: dict, labels: dict[str, str]) -> str:
    """The section's judgement of one regime, computed from its best row."""
    cost = (f"; {batch_cost_verdict(row['verify_tokens'], row['block'])} (llama-bench)"
            if row.get("verify_tokens") and row.get("block") else "")
    return (f"- **{regime} target**: {speed_verdict(row['speedup'], where='')} at best "
            f"({labels[row['drafter']]} {row['type']}, tau {row['tau']:.2f}){cost}.")


def markdown(section: dict, labels: dict[str, str]) -> list[str]:
    proofs = "; ".join(f"{p['type']}: {_exactness(p['divergences'])} over {p['tokens']} tokens"
                       for p in section["proofs"])
    best = {regime: max((r for r in section["rows"] if r["regime"] == regime), key=lambda r: r["speedup"] or 0)
            for regime in REGIMES}
    return [
        "## (f) Where drafting pays: a compute-bound and a memory-bound target",
        "",
        f"The same drafters on two targets with the same function: the trained target as it is, and the same "
        f"target with every FFN widened by inert, all-zero units (`benchmarks/memory_bound.py`) to about "
        f"{MEMORY_BOUND_MIB} MiB at F16, so that every decoded token streams the weights from memory as a real "
        f"model's does. Both at F16 and Q8_0 (llama-quantize), `validate -np 1`, {section['n_predict']} new tokens "
        f"per prompt, llama-server `{' '.join(section['server_args'])}`, each configuration {section['repeats']} "
        "times (the median speedup and the range). *efficiency* = speedup / tau: 1.0 would mean a verification "
        "step costs one target token and drafting is free. *verify / token*: llama-bench's time for a batch of "
        "the drafter's block size over its time per decoded token, on the same target; *ceiling* = 1 / that, the "
        "efficiency this machine allows even with free drafting and no overhead (llama-bench runs at depth 0: "
        "at the prompts' depth attention adds more to a batch than to one token, so the real ceiling is lower).",
        "",
        f"The widened targets give the original's tokens, with the drafter, against the original alone "
        f"(`validate --baseline`): {proofs}.",
        "",
        regime_table(section, labels),
        "",
        *[_verdict(regime, best[regime], labels) for regime in REGIMES],
        "",
        "Where a speculative step's time goes, in each regime at F16 (as in (e); *x / target token*: in units of "
        "the target's own single-token decode):",
        "",
        step_table(section, labels),
        "",
    ]
