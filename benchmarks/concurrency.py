"""Section (h) of `make bench`: speedup against concurrency, the way serving tables report it.

    .venv/bin/python -m benchmarks.concurrency [--quick] [--levels 1,2,4,8] [--docs DIR]

Each target below runs `dflash-gguf bench`'s library function (validation/concurrency.py): for every
level N, the target alone and the target with its drafter, each behind a llama-server with -np N,
N streams in flight, rounds of one pass on each server side by side; every stream's answers compared
with the target alone's at one slot. Targets:

  trained        the trained pair as it is (11 MiB, decodes from the CPU caches: compute-bound)
  memory-bound   the same target widened by inert FFN units to ~457 MiB (benchmarks/memory_bound.py)
  SmolLM2        the real SmolLM2-135M target and its drafter, when build/fixtures/smollm2 has both

It writes docs/benchmarks-concurrency.md and docs/benchmarks-concurrency.png (or under --docs).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dflash_gguf.progress import Progress

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
WORK = REPO / "build" / "bench" / "concurrency"
SMOLLM2 = REPO / "build" / "fixtures" / "smollm2"
LEVELS = (1, 2, 4, 8)
PAGE, PLOT = "benchmarks-concurrency.md", "benchmarks-concurrency.png"
# one thread per server (the machine is shared); the memory-bound target read from RAM, not mmap
SERVER_ARGS = ["-t", "1"]
MEMORY_BOUND_ARGS = ["--load-mode", "none"]


@dataclass
class Subject:
    label: str
    target: Path
    draft: Path
    prompts: list[str]
    server_args: list[str]


def smollm2_pair() -> tuple[Path, Path] | None:
    """The SmolLM2 target as users run it (Q4_K_M) and its better drafter (DFlash 2: the higher tau,
    training/README.md), when the issue-20 fixture has made them."""
    target, draft = SMOLLM2 / "target-Q4_K_M.gguf", SMOLLM2 / "dflash2.gguf"
    return (target, draft) if target.is_file() and draft.is_file() else None


def subjects(quick: bool, backend: str, server_args: list[str], progress: Progress) -> list[Subject]:
    from benchmarks.regimes import memory_bound_target
    from dflash_gguf.runner.prompts import read_prompts
    from training.fixtures.trained_gguf import trained_ggufs

    pair = trained_ggufs()
    prompts = read_prompts(pair["prompts"])[: 4 if quick else None]
    out = [Subject("trained pair (compute-bound)", pair["target"], pair["dflash"], prompts, server_args)]
    if quick:
        return out
    progress("(h) memory-bound target: the trained target widened by inert FFN units")
    wide = memory_bound_target(pair["target"], REPO / "build" / "bench" / "trained" / "regimes")
    # a token of the widened target streams ~40x the bytes of the original's: half the prompts
    out.append(Subject(f"memory-bound ({wide.stat().st_size / 2**20:.0f} MiB)", wide, pair["dflash"],
                       prompts[: max(2, len(prompts) // 2)], [*server_args, *MEMORY_BOUND_ARGS]))
    smol = smollm2_pair()
    if smol is not None:
        from dflash_gguf.runner.prompts import BUILTIN_PROMPTS

        out.append(Subject(f"SmolLM2 {smol[0].stem}", smol[0], smol[1], list(BUILTIN_PROMPTS), server_args))
    else:
        progress(f"(h) SmolLM2: no target-*.gguf and dflash*.gguf under {SMOLLM2}; left out")
    return out


def concurrency_section(quick: bool, backend: str, progress: Progress, levels: tuple[int, ...] = LEVELS,
                        n_predict: int | None = None, rounds: int | None = None,
                        server_args: list[str] | None = None, llama_bin: Path | None = None,
                        exact: bool = False, keep: Callable[[Subject], bool] | None = None) -> dict:
    """The curve on each subject; `keep(subject)`, asked as each subject comes up, may leave it out
    (gpu_run.py: one that would not end before the deadline)."""
    from dflash_gguf.validation.bench import BenchSettings, concurrency_curve

    n_predict = n_predict or (16 if quick else 64)
    rounds = rounds or (1 if quick else 3)
    rows = []
    for subject in subjects(quick, backend, list(SERVER_ARGS if server_args is None else server_args), progress):
        if keep is not None and not keep(subject):
            continue
        progress(f"(h) {subject.label}: concurrency {','.join(map(str, levels))}, {len(subject.prompts)} prompts x "
                 f"{n_predict} tokens, {rounds} round(s)")
        settings = BenchSettings(levels=levels, n_predict=n_predict, rounds=rounds, backend=backend,
                                 llama_bin=llama_bin, server_args=subject.server_args, exact=exact)
        report = concurrency_curve(subject.target, subject.draft, subject.prompts, settings,
                                   progress=lambda m: progress("    " + m)).to_dict()
        rows.append({"label": subject.label, "target_mib": round(subject.target.stat().st_size / 2**20, 1),
                     "server_args": subject.server_args, **report})
        progress(f"(h) {subject.label}: {report['verdict']}")
    return {"subjects": rows, "levels": list(levels), "n_predict": n_predict, "rounds": rounds, "exact": exact}


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def curve_table(subject: dict) -> str:
    from dflash_gguf.validation.bench import ALONE, DRAFTER

    lines = ["| streams (-np) | aggregate tok/s, target alone | aggregate tok/s, drafter | speedup (runs) | "
             "per-request tok/s alone / drafter | tau | acceptance per slot | identical streams |",
             "|---:|---:|---:|---|---|---:|---|---|"]
    for r in subject["levels"]:
        agg, per = r["aggregate_tokens_per_second"], r["per_request_tokens_per_second"]
        runs = ", ".join(f"{x:.2f}" for x in r["speedup_runs"])
        slots = " ".join(f"{s['acceptance_rate']:.2f}" for s in r["slots"])
        same = sum(s["identical"] for s in r["streams"])
        alone_note = "" if r["target_alone_identical"] else " (target alone at -np N differs from -np 1 too)"
        lines.append(f"| {r['concurrency']} | {_fmt(agg[ALONE])} | {_fmt(agg[DRAFTER])} | "
                     f"**{_fmt(r['speedup'], '.2f')}x** ({runs}) | {_fmt(per[ALONE])} / {_fmt(per[DRAFTER])} | "
                     f"{r['tau']:.2f} | {slots} | {same} of {len(r['streams'])}{alone_note} |")
    return "\n".join(lines)


def shared(load: dict, machine: dict) -> bool:
    """Whether other work ran beside the benchmark: a load average above half the cores."""
    cores = int(machine.get("nproc") or 1)
    return max(load["start"][0], load["end"][0]) > cores / 2


def render_markdown(section: dict, machine: dict, load: dict, png_name: str | None, command: str) -> str:
    lines = [
        "# Concurrency: speedup against streams in flight",
        "",
        f"Generated by `{command}` on {machine['date']} ({machine['cpu']} x {machine['nproc']}, "
        f"{machine['memory_gib']} GiB, {machine['os']}), llama.cpp build "
        f"{section['subjects'][0]['llama']['build'] if section['subjects'] else '-'} "
        f"({section['subjects'][0]['llama']['backend'] if section['subjects'] else '-'}). "
        + (f"**The machine was shared** (load average {load['start'][0]:.2f} at the start, {load['end'][0]:.2f} "
           "at the end, on " f"{machine['nproc']} cores): absolute tokens/s are noisy. "
           if shared(load, machine) else
           f"Load average {load['start'][0]:.2f} at the start, {load['end'][0]:.2f} at the end. ")
        + "Each speedup is a ratio measured side by side (the same "
        "streams sent to the target alone's server and to the drafter's, one pass after the other, the "
        f"order alternating), the median of {section['rounds']} round(s), every round's ratio in brackets.",
        "",
        f"Each level N: two llama-servers with `-np N` (serve's launch), N client streams at once, each "
        f"sending its requests one at a time, greedy, {section['n_predict']} new tokens; aggregate tok/s = "
        "all streams' tokens / wall time of the pass; per-request tok/s = the server's own timing (median). "
        "Acceptance per slot = accepted / drafted tokens of the answers each server slot produced "
        "(llama.cpp #27117). *Identical streams*: streams whose every answer is identical, token for token, "
        "to the target alone's at one slot for the same prompt"
        + (" (run with `--exact`: batch-invariant kernels, so a difference would be the drafter's)."
           if section.get("exact") else
           " (without `--exact` a difference can be batching numerics rather than the drafter: "
           "docs/validate.md).") + " Reproduce: "
        "`dflash-gguf bench --target T --draft D --concurrency 1,2,4,8 -- -t 1`.",
        "",
    ]
    if png_name:
        lines += [f"![speedup against concurrency]({png_name})", ""]
    for s in section["subjects"]:
        lines += [f"## {s['label']}", "",
                  f"`{Path(s['target']).name}` ({s['target_mib']} MiB) with `{Path(s['draft']).name}`, "
                  f"{s['settings']['prompts']} prompts, draft length {s['settings']['draft_max']}, server "
                  f"arguments `{' '.join(s['server_args'])}`. **{s['verdict'][0].upper() + s['verdict'][1:]}.** "
                  + ("Every stream identical at every level." if s["identical"] else
                     "**Not every stream was identical** (see the table)."),
                  "", curve_table(s), ""]
    return "\n".join(lines)


def render_chart(section: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    for s in section["subjects"]:
        xs = [r["concurrency"] for r in s["levels"]]
        left.plot(xs, [r["speedup"] for r in s["levels"]], marker="o", label=s["label"])
        right.plot(xs, [r["tau"] for r in s["levels"]], marker="o", label=s["label"])
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(section["levels"], [str(n) for n in section["levels"]])
        ax.set_xlabel("concurrent streams (-np)")
        ax.legend(fontsize=8)
    left.axhline(1.0, color="black", lw=0.8, ls="--")
    left.set_ylabel("speedup (aggregate tok/s, drafter / target alone)")
    left.set_ylim(bottom=0)
    right.set_ylabel("tau (tokens per verification step)")
    right.set_ylim(bottom=0)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(section: dict, docs: Path, machine: dict, load: dict, command: str, page: str = PAGE,
          plot: str | None = PLOT) -> Path:
    docs.mkdir(parents=True, exist_ok=True)
    if plot:
        render_chart(section, docs / plot, f"speedup against concurrency, {machine['cpu']} x {machine['nproc']} "
                                           f"(shared), {machine['date']}")
    out = docs / page
    out.write_text(render_markdown(section, machine, load, plot, command))
    return out


def main(argv: list[str] | None = None) -> None:
    from benchmarks.bench import machine_info, progress
    from dflash_gguf.runner.build import default_backend

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the trained pair only, 4 prompts, 16 tokens, 1 round")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrency levels (1,2,4,8)")
    parser.add_argument("-n", "--n-predict", type=int, default=None, help="new tokens per request (64)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per level (3)")
    parser.add_argument("--exact", action="store_true",
                        help="serve's --exact (batch-invariant kernels): 'identical' becomes a bit-exact check")
    parser.add_argument("--backend", choices=("cpu", "cuda", "metal"), default=None)
    parser.add_argument("--llama-bin", type=Path, default=None, help="another build's bin folder")
    parser.add_argument("--docs", type=Path, default=DOCS, help=f"where {PAGE} and {PLOT} go")
    parser.add_argument("--json", type=Path, default=None, help=f"raw results (default {WORK}/results.json)")
    parser.add_argument("server_args", nargs="*", help="llama-server arguments after -- (default: -t 1)")
    args = parser.parse_args(argv)
    backend = args.backend or default_backend()
    load = {"start": os.getloadavg()}
    started = time.perf_counter()
    section = concurrency_section(args.quick, backend, progress, tuple(int(x) for x in args.levels.split(",")),
                                  args.n_predict, args.rounds, args.server_args or None, args.llama_bin,
                                  args.exact)
    load["end"] = os.getloadavg()
    section["run_seconds"] = round(time.perf_counter() - started, 1)
    out_json = args.json or WORK / "results.json"
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(section, indent=2, default=str))
    import sys

    shown = [a for a in (argv if argv is not None else sys.argv[1:])]
    suffix = "-exact" if args.exact else ""  # the --exact curve is a page of its own beside the default one
    page = write(section, args.docs, machine_info(), load, " ".join(["python -m benchmarks.concurrency", *shown]),
                 page=PAGE.replace(".md", f"{suffix}.md"), plot=PLOT.replace(".png", f"{suffix}.png"))
    progress(f"wrote {page}, {out_json} in {section['run_seconds'] / 60:.1f} min "
             f"({_dt.datetime.now(_dt.timezone.utc):%H:%M} UTC)")


if __name__ == "__main__":
    main()
