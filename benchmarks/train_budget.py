"""Does `train --minutes M` keep its budget when the machine's load changes while it trains?

Runs `dflash-gguf train --minutes M --json` (one thread, no held-out measurement) and, while it
trains, one busy process per `--busy` core: started at `--busy-from` of the budget and stopped at
`--busy-to` (fractions; `--busy-from 0 --busy-to 0.5` is a load that goes away, `0.5 1` one that
comes). The training clock starts at train's first step line. Prints, as JSON: the budget, the
training seconds train reports, their ratio (issue 48's goal: 0.85-1.15), the steps, and when the
load ran.

    python -m benchmarks.train_budget --target target-Q4_K_M.gguf --prompts benchmarks/prompts/code.jsonl \
        --minutes 10 --busy-from 0.3 --busy-to 0.7
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

_STEP = re.compile(r"M parameters, \S+ steps")


def _busy() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def run(target: Path, prompts: Path, minutes: float, busy_from: float, busy_to: float, busy: int,
        variant: str) -> dict:
    budget = minutes * 60
    with tempfile.TemporaryDirectory(prefix="train-budget-") as folder:
        out = Path(folder) / "drafter"
        command = [sys.executable, "-m", "dflash_gguf.cli", "train", "-t", str(target), "--prompts", str(prompts),
                   "-o", str(out), "--minutes", str(minutes), "--variant", variant, "--threads", "1",
                   "--no-validate", "--answer-tokens", "64", "--json"]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        started: list[float] = []
        load: dict[str, float] = {}
        workers: list[subprocess.Popen] = []

        def watch_stderr() -> None:
            for line in proc.stderr:
                sys.stderr.write(line)
                if not started and _STEP.search(line):
                    started.append(time.time())

        reader = threading.Thread(target=watch_stderr, daemon=True)
        reader.start()
        try:
            while proc.poll() is None:
                time.sleep(1)
                if not started:
                    continue
                elapsed = time.time() - started[0]
                if not workers and "on" not in load and elapsed >= busy_from * budget:
                    workers = [_busy() for _ in range(busy)]
                    load["on"] = round(elapsed, 1)
                if workers and elapsed >= busy_to * budget:
                    for w in workers:
                        w.kill()
                    workers = []
                    load["off"] = round(elapsed, 1)
        finally:
            for w in workers:
                w.kill()
        stdout = proc.stdout.read()
        reader.join(timeout=5)
        if proc.returncode != 0:
            raise SystemExit(f"train failed with exit status {proc.returncode}")
    summary = json.loads(stdout)
    seconds = summary["train_seconds"]
    return {"budget_seconds": budget, "train_seconds": seconds, "ratio": round(seconds / budget, 3),
            "within_goal": 0.85 <= seconds / budget <= 1.15, "steps": summary["steps"],
            "busy_processes": busy, "busy_seconds": load, "variant": variant, "target": str(target),
            "cores": os.cpu_count()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--busy-from", type=float, default=0.3)
    parser.add_argument("--busy-to", type=float, default=0.7)
    parser.add_argument("--busy", type=int, default=1, help="busy processes (one per core they should take)")
    parser.add_argument("--variant", default="dflash", choices=["dflash", "dflash2"])
    args = parser.parse_args()
    print(json.dumps(run(args.target, args.prompts, args.minutes, args.busy_from, args.busy_to, args.busy,
                         args.variant), indent=2))


if __name__ == "__main__":
    main()
