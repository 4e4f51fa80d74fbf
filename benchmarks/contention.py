"""Threads under contention: llama-server's speed at each thread setting, on a quiet machine and with
one busy process per core beside it, the settings measured side by side in each condition.

llama.cpp's CPU thread pool spins while it waits at the barrier between graph nodes (`--poll`, 0-100,
default 50): on cores nobody else wants that saves wake-ups, but when another process holds a core
the spinning threads take turns with it at the scheduler's pace, and a 2-thread server on 2 busy
cores fell from 55 to 2 tok/s in `make demo`. This measures what each setting keeps of its quiet
speed, for the target alone and with the drafter.

    python -m benchmarks.contention [--type F16] [--rounds 3] [--n-predict 32] [--prompts 4]

Prints a JSON document on stdout (progress on stderr); docs/speed.md#threads-under-contention shows
the table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys

from dflash_gguf.runner.build import find_bin_dir
from dflash_gguf.runner.launch import launch_recipe
from dflash_gguf.runner.prompts import BUILTIN_PROMPTS, tokenize_prompts
from dflash_gguf.runner.speed import cpus, load_average
from benchmarks.side_by_side import measure_side_by_side, progress
from training.fixtures.smollm2 import smollm2_ggufs

SETTINGS = {
    "-t 1": ["-t", "1"],
    "-t 1 --poll 0": ["-t", "1", "--poll", "0"],
    "-t 2": ["-t", "2"],
    "-t 2 --poll 0": ["-t", "2", "--poll", "0"],
}
BUSY = [sys.executable, "-c", "while True: pass"]


@contextlib.contextmanager
def busy_cores(n: int):
    """`n` processes that each keep one core busy, until the block ends."""
    procs = [subprocess.Popen(BUSY) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def measure(target, draft, bin_dir, ids, rounds: int, n_predict: int) -> dict:
    servers = {}
    with contextlib.ExitStack() as stack:
        for label, args in SETTINGS.items():
            for kind, d in (("alone", None), ("drafter", draft)):
                launch = launch_recipe(target, d, server_args=["-c", "2048", *args], check=False)
                servers[f"{kind} {label}"] = stack.enter_context(launch.server(bin_dir=bin_dir))
        for server in servers.values():
            server.client.complete(ids[0][:8], 4, cache_prompt=False)
        load_before = load_average()
        out = measure_side_by_side(servers, ids, n_predict, rounds)
    return {name: {"tokens_per_second": round(1000.0 / statistics.median(ms), 2) if statistics.median(ms) else 0.0,
                   "rounds_ms_per_token": [round(x, 3) for x in ms]} for name, ms in out.ms.items()} | {
        "_load_average": [load_before, load_average()]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--type", default="F16")
    parser.add_argument("--drafter", default="dflash2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n-predict", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=4)
    args = parser.parse_args(argv)
    files = smollm2_ggufs()
    target, draft = files[args.type], files[args.drafter]
    bin_dir = find_bin_dir(None, None)
    n_cores = cpus()
    with launch_recipe(target, None, server_args=["-t", "1"], check=False).server(bin_dir=bin_dir) as server:
        ids = tokenize_prompts(server.client, list(BUILTIN_PROMPTS)[:args.prompts])
    result = {"target": str(target), "draft": str(draft), "cores": n_cores, "rounds": args.rounds,
              "n_predict": args.n_predict, "prompts": len(ids), "conditions": {}}
    progress(f"quiet: {len(SETTINGS) * 2} servers side by side")
    result["conditions"]["quiet"] = measure(target, draft, bin_dir, ids, args.rounds, args.n_predict)
    progress(f"busy: the same, beside {n_cores} busy process(es), one per core")
    with busy_cores(n_cores):
        result["conditions"]["busy"] = measure(target, draft, bin_dir, ids, args.rounds, args.n_predict)
    quiet, busy = result["conditions"]["quiet"], result["conditions"]["busy"]
    result["kept"] = {name: round(busy[name]["tokens_per_second"] / quiet[name]["tokens_per_second"], 3)
                      for name in quiet if not name.startswith("_") and quiet[name]["tokens_per_second"]}
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
