"""Speed figures under load: `validate`, `bench` and `tune --quick` on SmolLM2, each run on the quiet
machine and again with one busy process per core beside it, through the CLI as a user runs them.

The goal (issue 46): under load each command's speedup is within 20 % of its quiet figure, or it is
withheld ("not measured reliably here: <why>"), never a figure that is wrong by more. Per command and
condition this prints the speedup or the reason it was withheld, the load average, and the verdict.

    python -m benchmarks.under_load [--commands validate,bench,tune] [--drafter dflash2] [--prompts 4]

JSON on stdout, progress on stderr; docs/speed.md#speed-figures-under-load shows the table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dflash_gguf.runner.speed import cpus, load_average
from benchmarks.contention import busy_cores
from benchmarks.prompt_sets import EVAL_PROMPTS, pair_files
from benchmarks.side_by_side import progress

TOLERANCE = 0.20


def command(name: str, target: Path, draft: Path, prompts: Path) -> list[str]:
    base = [sys.executable, "-m", "dflash_gguf.cli", name, "-t", str(target), "-d", str(draft),
            "--prompts", str(prompts), "--json"]
    return base + {"validate": ["-n", "48", "--rounds", "3"], "bench": ["--concurrency", "1", "-n", "48", "--rounds", "3"],
                   "tune": ["--quick"]}[name]


def speedup_of(name: str, report: dict) -> tuple[float | None, str | None]:
    if name == "bench":
        level = report["levels"][0]
        return level["speedup"], level["speed"].get("speedup_unreliable")
    return report.get("speedup"), report.get("speedup_unreliable")


def run(name: str, argv: list[str]) -> dict:
    start, load = time.monotonic(), load_average()
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"exit": proc.returncode, "error": proc.stderr.strip().splitlines()[-1:] or [""]}
    speedup, why = speedup_of(name, json.loads(proc.stdout))
    return {"speedup": speedup, "withheld": why, "load_average": [load, load_average()],
            "seconds": round(time.monotonic() - start, 1)}


def verdict(quiet: dict, busy: dict) -> str:
    if busy.get("speedup") is None:
        return "withheld under load" if busy.get("withheld") else "failed"
    if quiet.get("speedup") is None:
        return "no quiet figure to compare"
    off = abs(busy["speedup"] / quiet["speedup"] - 1.0)
    return f"{'within' if off <= TOLERANCE else 'OUTSIDE'} 20 % ({off:.1%} off)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", default="validate,bench,tune")
    parser.add_argument("--drafter", default="dflash2")
    parser.add_argument("--prompts", type=int, default=4)
    args = parser.parse_args(argv)
    files = pair_files("smollm2")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "prompts.jsonl"
        prompts.write_text("".join(EVAL_PROMPTS.read_text().splitlines(keepends=True)[:args.prompts]))
        for name in args.commands.split(","):
            argv_ = command(name, files["F16"], files[args.drafter], prompts)
            progress(f"{name}: quiet")
            quiet = run(name, argv_)
            progress(f"{name}: quiet {quiet}; now with {cpus()} busy processes")
            with busy_cores(cpus()):
                busy = run(name, argv_)
            row = {"command": name, "quiet": quiet, "busy": busy, "verdict": verdict(quiet, busy)}
            progress(f"{name}: busy {busy}: {row['verdict']}")
            rows.append(row)
    json.dump({"cores": cpus(), "busy_processes": cpus(), "drafter": args.drafter, "rows": rows}, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
