"""The sections `benchmarks/gpu.sh` runs once the build is there, against a deadline, into one page.

    .venv/bin/python -m benchmarks.gpu_run --backend cuda --out docs/benchmarks-cuda.md --deadline EPOCH

Sections, each skipped (and said so on the page) when the deadline would pass before it ends:

  validate        the trained pair, each drafter: lossless (every token checked), tau, speedup
  memory-bound    the trained target widened by inert FFN units (benchmarks/memory_bound.py): first
                  proven to give the original's tokens (validate --baseline), then each drafter
  SmolLM2         the real target and its drafter, when build/fixtures/smollm2 has both
  concurrency     `dflash-gguf bench`'s curve on each of those targets (benchmarks/concurrency.py)
  train           `dflash-gguf train` on the trained pair's target (when the [reference] extra is installed):
                  the teacher on this build, torch on the best device it sees, held-out tau at the end

Every speedup is a ratio measured side by side in one run (validate: the target alone and the
speculative server on the same prompts, one after the other; concurrency: rounds of passes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import concurrency
from benchmarks.bench import DRAFTER_LABELS, machine_info
from dflash_gguf.validation.lossless import MISMATCH, NUMERICAL

REPO = Path(__file__).resolve().parents[1]
_T0 = time.time()


def progress(msg: str) -> None:
    print(f"[{time.time() - _T0:6.1f}s] {msg}", flush=True)


def gpu_info() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return "; ".join(line.strip() for line in out.splitlines() if line.strip()) or None


class Clock:
    """What is left before the deadline, and whether a section estimated at `seconds` still fits."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.skipped: list[str] = []

    def left(self) -> float:
        return self.deadline - time.time()

    def fits(self, section: str, seconds: float) -> bool:
        if self.left() >= seconds:
            return True
        self.skipped.append(f"{section} (needed ~{seconds:.0f} s, {max(0.0, self.left()):.0f} s left)")
        progress(f"skipping {section}: ~{seconds:.0f} s needed, {max(0.0, self.left()):.0f} s left")
        return False


def _validate_row(label: str, report: dict) -> dict:
    kinds = [d["kind"] for d in report["divergences"]]
    return {"label": label, "exact": report["exact"], "lossless": report["lossless"],
            "checked": report["positions_checked"], "produced": report["produced"],
            "mismatches": kinds.count(MISMATCH), "numerical": kinds.count(NUMERICAL),
            "tau": report["mean_acceptance_length"],
            "acceptance_rate": report["acceptance_rate"], "tps_target": report["tokens_per_second"]["target"],
            "tps_speculative": report["tokens_per_second"]["speculative"], "speedup": report["speedup"],
            "build": report["llama"]["build"]}


def validate_rows(target: Path, drafts: dict[str, Path], prompts: list[str], n_predict: int, backend: str,
                  server_args: list[str], baseline: Path | None = None, llama_bin: Path | None = None) -> list[dict]:
    from dflash_gguf.validation.validate import ValidationSettings, validate

    rows = []
    for name, draft in drafts.items():
        settings = ValidationSettings(n_predict=n_predict, backend=backend, llama_bin=llama_bin,
                                      server_args=list(server_args))
        progress(f"validate {target.name} + {draft.name}: {len(prompts)} prompts x {n_predict} tokens")
        report = validate(target, draft, prompts, settings, baseline=baseline,
                          progress=lambda m: progress("    " + m)).to_dict()
        rows.append(_validate_row(DRAFTER_LABELS.get(name, name), report))
        r = rows[-1]
        progress(f"  -> exact {r['exact']}, tau {r['tau']:.2f}, {r['tps_target']:.1f} -> {r['tps_speculative']:.1f} "
                 f"tok/s ({r['speedup']}x)")
    return rows


def validate_table(rows: list[dict]) -> str:
    lines = ["| drafter | lossless (tokens checked) | tau | acceptance | tok/s target alone | tok/s with drafter | speedup |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        ok = "yes" if r["lossless"] and not r["mismatches"] else f"NO ({r['mismatches']} mismatches)"
        ok += f", {r['numerical']} numerical (batching)" if r["numerical"] else ""
        lines.append(f"| {r['label']} | {ok} ({r['checked']} of {r['produced']}) | {r['tau']:.2f} | "
                     f"{r['acceptance_rate']:.2f} | {r['tps_target']:.1f} | {r['tps_speculative']:.1f} | "
                     f"**{r['speedup']}x** |")
    return "\n".join(lines)


TRAIN_PROMPTS = 200  # of training/smollm2_prompts.py's generator (seed 7), as the zoo's drafters learn from


def train_section(pair: dict[str, Path], args: argparse.Namespace) -> dict:
    """`dflash-gguf train --variant dflash` on the trained pair's target for a fixed number of steps, its
    held-out tau measured on the pair's held-out prompts: what the teacher and a training step cost here
    (the same command on another machine is the comparison)."""
    from dflash_gguf.extras import missing
    from training.fixtures.trained_gguf import held_out_prompts
    from training.smollm2_prompts import build_prompts

    absent = missing("reference")
    if absent:
        return {"missing": absent}
    held = held_out_prompts()
    with tempfile.TemporaryDirectory() as tmp:
        prompts, evals = Path(tmp) / "prompts.jsonl", Path(tmp) / "held-out.jsonl"
        prompts.write_text("".join(json.dumps(c) + "\n" for c in build_prompts(TRAIN_PROMPTS, 7, held)))
        evals.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in held[: args.prompts]))
        cmd = [sys.executable, "-m", "dflash_gguf.cli", "train", "-t", str(pair["target"]), "--prompts", str(prompts),
               "--eval-prompts", str(evals), "--variant", "dflash", "--steps", str(args.train_steps),
               "--answer-tokens", str(args.n_predict), "--eval-tokens", str(args.n_predict), "--backend", args.backend,
               "-o", str(Path(tmp) / "drafter"), "--json"]
        cmd += ["--llama-bin", str(args.llama_bin)] if args.llama_bin else []
        cmd += ["--threads", str(args.train_threads)] if args.train_threads else []
        started = time.time()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True)
        if proc.returncode != 0:
            return {"failed": f"exit {proc.returncode}", "command": " ".join(cmd[2:])}
    summary = json.loads(proc.stdout)
    return {"prompts": summary["prompts_trained"], "answer_tokens": summary["answer_tokens"],
            "teacher_seconds": summary["teacher_seconds"], "steps": summary["steps"],
            "train_seconds": summary["train_seconds"], "device": summary["device"],
            "peak_rss_mib": round(summary["peak_rss_bytes"] / 2**20), "held_out": summary["held_out"],
            "wall_seconds": round(time.time() - started, 1)}


def train_text(t: dict) -> list[str]:
    if "missing" in t:
        absent = ", ".join(t["missing"])
        return [f"Not run: `dflash-gguf train` needs the [reference] extra ({absent} not installed)."]
    if "failed" in t:
        return [f"**Failed** ({t['failed']}): `dflash-gguf {t['command']}`."]
    held = t["held_out"]
    return [f"`dflash-gguf train --variant dflash --steps {t['steps']}` on the trained pair's target: "
            f"{t['prompts']} prompts answered by this build's llama.cpp in {t['teacher_seconds']:.1f} s (at most "
            f"{t['answer_tokens']} tokens each), {t['steps']} steps on torch's `{t['device']}` in "
            f"{t['train_seconds']:.1f} s ({1000 * t['train_seconds'] / max(t['steps'], 1):.0f} ms a step), "
            f"{t['wall_seconds']:.0f} s in all with the held-out measurement; peak memory {t['peak_rss_mib']} MiB.",
            "", f"Held-out tau {held['tau']:.2f} on {held['prompts']} prompts x {held['n_predict']} tokens, "
            f"lossless: {'yes' if held['lossless'] else '**NO**'} (llama.cpp {held['llama']})."]


def run(args: argparse.Namespace, save) -> dict:
    from benchmarks.regimes import memory_bound_target
    from dflash_gguf.runner.prompts import BUILTIN_PROMPTS, read_prompts
    from training.fixtures.trained_gguf import trained_ggufs

    clock = Clock(args.deadline)
    server_args = args.server_args
    pair = trained_ggufs()
    prompts = read_prompts(pair["prompts"])[: args.prompts]
    drafts = {name: pair[name] for name in ("dflash", "dflash2", "dspark")}
    results: dict = {"sections": {}, "skipped": clock.skipped}

    progress("(1) validate: the trained pair")
    results["sections"]["validate"] = validate_rows(pair["target"], drafts, prompts, args.n_predict, args.backend,
                                                    server_args, llama_bin=args.llama_bin)
    save(results)
    # before the slower sections: a short deadline still measures what training costs here
    if args.train_steps and clock.fits("train", args.estimate * 2):
        progress(f"(2) train: {args.train_steps} steps on the trained pair's target")
        results["sections"]["train"] = train_section(pair, args)
        progress(f"  -> {json.dumps(results['sections']['train'])}")
        save(results)
    wide = memory_bound_target(pair["target"], REPO / "build" / "bench" / "trained" / "regimes")
    if clock.fits("memory-bound", args.estimate * 3):
        progress(f"(3) memory-bound: {wide.name} ({wide.stat().st_size / 2**20:.0f} MiB), tokens against the original")
        bound_args = [*server_args, *concurrency.MEMORY_BOUND_ARGS]
        proof = validate_rows(wide, {"dflash": drafts["dflash"]}, prompts, args.n_predict, args.backend, bound_args,
                              baseline=pair["target"], llama_bin=args.llama_bin)
        results["sections"]["memory_bound_proof"] = proof
        results["sections"]["memory_bound"] = validate_rows(
            wide, {k: drafts[k] for k in ("dflash", "dflash2")}, prompts, args.n_predict, args.backend, bound_args,
            llama_bin=args.llama_bin)
    smol = concurrency.smollm2_pair()
    if smol is None:
        results["sections"]["smollm2"] = None
        progress(f"(4) SmolLM2: not under {concurrency.SMOLLM2}; left out")
    elif clock.fits("SmolLM2", args.estimate):
        progress(f"(4) SmolLM2: {smol[0].name} + {smol[1].name}")
        results["sections"]["smollm2"] = validate_rows(smol[0], {"dflash2": smol[1]}, list(BUILTIN_PROMPTS),
                                                       args.n_predict, args.backend, server_args,
                                                       llama_bin=args.llama_bin)
    save(results)
    if clock.fits("concurrency", args.estimate):
        progress(f"(5) concurrency {args.levels}")
        results["sections"]["concurrency"] = concurrency.concurrency_section(
            False, args.backend, progress, tuple(int(x) for x in args.levels.split(",")), args.n_predict,
            args.rounds, server_args, llama_bin=args.llama_bin,
            keep=lambda subject: clock.fits(f"concurrency on {subject.label}", args.estimate * 3))
    return results


def render(results: dict, args: argparse.Namespace, machine: dict, load: dict) -> str:
    s = results["sections"]
    gpu = gpu_info() if args.backend == "cuda" else None
    build = s["validate"][0]["build"] if s.get("validate") else "-"
    lines = [f"# Benchmarks on {'CUDA' if args.backend == 'cuda' else args.backend.upper()}", "",
             f"Generated by `benchmarks/gpu.sh{' --cpu' if args.backend == 'cpu' else ''}` "
             f"(`benchmarks/gpu_run.py`) on {machine['date']} in {results['seconds'] / 60:.1f} minutes: "
             f"{gpu or 'no GPU'}; {machine['cpu']} x {machine['nproc']}, {machine['memory_gib']} GiB; "
             f"llama.cpp {args.backend} build {build}; llama-server arguments `{' '.join(args.server_args)}`; "
             f"load average {load['start'][0]:.2f} at the start, {load['end'][0]:.2f} at the end"
             + (" (**the machine was shared**)" if args.shared else "") + ".",
             "",
             "Every speedup is a ratio measured side by side in one run: `validate` times the target alone and "
             "the speculative server on the same prompts one after the other (greedy, every emitted token "
             "checked against the target's logits); the concurrency curve alternates passes of the same streams "
             "on both servers and gives the median of its rounds.", ""]
    if s.get("memory_bound_proof"):
        p = s["memory_bound_proof"][0]
        same = "the same tokens as" if p["exact"] and not p["mismatches"] else "**other tokens than**"
        s_proof = (f"The widened target with {p['label']} gives {same} the original alone "
                   f"(`validate --baseline`, {p['checked']} of {p['produced']} tokens checked).")
    sections = [("Trained pair (validate)", "validate"), ("Memory-bound widening (validate)", "memory_bound"),
                ("SmolLM2 (validate)", "smollm2")]
    for title, key in sections:
        if s.get(key):
            lines += [f"## {title}", ""]
            if key == "memory_bound" and s.get("memory_bound_proof"):
                lines += [s_proof, ""]
            lines += [validate_table(s[key]), ""]
    if s.get("smollm2", 0) is None:
        lines += ["## SmolLM2", "", "Not run: no target-*.gguf and dflash*.gguf under `build/fixtures/smollm2`.", ""]
    if s.get("concurrency"):
        lines += ["## Concurrency", ""]
        for subject in s["concurrency"]["subjects"]:
            lines += [f"### {subject['label']}", "", f"{subject['verdict'][0].upper() + subject['verdict'][1:]}; "
                      + ("every stream identical to the target alone's one-slot answers." if subject["identical"] else
                         "**not every stream identical to the target alone's one-slot answers** (batching "
                         "numerics unless the run was --exact: docs/validate.md)."),
                      "", concurrency.curve_table(subject), ""]
    if s.get("train"):
        lines += ["## Training a drafter (`dflash-gguf train`)", "", *train_text(s["train"]), ""]
    if results["skipped"]:
        lines += ["## Skipped for time", "", *[f"- {x}" for x in results["skipped"]], ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("cpu", "cuda", "metal"), required=True)
    parser.add_argument("--out", type=Path, required=True, help="the page to write")
    parser.add_argument("--deadline", type=float, default=time.time() + 600, help="epoch seconds")
    parser.add_argument("--estimate", type=float, default=60, help="seconds one validate section is expected to take")
    parser.add_argument("--levels", default="1,2,4,8")
    parser.add_argument("--prompts", type=int, default=6, help="held-out prompts of the trained pair to use")
    parser.add_argument("-n", "--n-predict", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--llama-bin", type=Path, default=None, help="another build's bin folder")
    parser.add_argument("--train-steps", type=int, default=1000, help="steps of the train section (0: leave it out)")
    parser.add_argument("--train-threads", type=int, default=None, help="the train section's --threads")
    parser.add_argument("--shared", action="store_true", help="say on the page that the machine was shared")
    parser.add_argument("server_args", nargs="*", help="llama-server arguments for every run (after --)")
    args = parser.parse_args(argv)
    load = {"start": os.getloadavg()}
    raw = REPO / "build" / "gpu-run" / f"results-{args.backend}.json"
    machine = machine_info()

    def save(results: dict) -> None:
        """The page and the raw numbers as they stand: a run stopped later keeps what it measured."""
        load["end"] = os.getloadavg()
        results["seconds"] = round(time.time() - _T0, 1)
        raw.parent.mkdir(parents=True, exist_ok=True)
        raw.write_text(json.dumps(results, indent=2, default=str))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(render(results, args, machine, load))

    save(run(args, save))
    progress(f"wrote {args.out} (raw numbers: {raw})")


if __name__ == "__main__":
    main()
