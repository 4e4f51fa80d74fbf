"""What `--exact` costs: serve's launch with and without it, the target alone and with the drafter,
four servers side by side (benchmarks/side_by_side.py), on one target.

    .venv/bin/python -m benchmarks.exact_cost --target T --draft D [--prompts P.jsonl] [--count 6]
        [-n 64] [--rounds 3] [-- -t 1]

Per server the milliseconds per generated token (the server's own `predicted_ms`), the median over
rounds; the cost is each exact server's ms/token over the default one's of the same round, the
median. Each launch's answers with the drafter are compared token for token with its target alone's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
from pathlib import Path

from benchmarks.side_by_side import measure_side_by_side, progress

PAIRS = (("alone", "target alone"), ("drafter", "with drafter"))


def measure(target: Path, draft: Path, prompts: list, n_predict: int, rounds: int, server_args: list[str],
            backend: str = "cpu", llama_bin: Path | None = None) -> dict:
    from dflash_gguf.runner.build import find_bin_dir
    from dflash_gguf.runner.launch import launch_recipe
    from dflash_gguf.runner.measure import first_divergence, measuring_launch
    from dflash_gguf.runner.prompts import tokenize_prompts

    bin_dir = find_bin_dir(backend, llama_bin)
    launches = {}
    for exact in (False, True):
        spec = measuring_launch(launch_recipe(target, draft, server_args=server_args, exact=exact), prompts, n_predict)
        mode = "exact" if exact else "default"
        launches[f"{mode} alone"], launches[f"{mode} drafter"] = spec.alone(), spec
    with contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(launch.server(bin_dir=bin_dir)) for name, launch in launches.items()}
        progress(f"4 servers up: {', '.join(servers)}")
        ids = tokenize_prompts(servers["default alone"].client, prompts)
        run = measure_side_by_side(servers, ids, n_predict, rounds)
    ms = run.ms
    median = {name: round(statistics.median(v), 3) for name, v in ms.items()}
    return {
        "target": str(target), "draft": str(draft), "prompts": len(ids), "n_predict": n_predict, "rounds": rounds,
        "server_args": server_args,
        "ms_per_token": median,
        "tokens_per_second": {name: round(1000.0 / v, 2) if v else None for name, v in median.items()},
        "exact_over_default_ms": {label: round(statistics.median(e / d for d, e in zip(ms[f"default {k}"],
                                                                                       ms[f"exact {k}"])), 3)
                                  for k, label in PAIRS},
        "speedup": {mode: round(statistics.median(a / s for a, s in zip(ms[f"{mode} alone"], ms[f"{mode} drafter"])), 3)
                    for mode in ("default", "exact")},
        "accepted": {name: n for name, n in run.accepted.items() if name.endswith("drafter")},
        # prompts whose answer with the drafter is the target alone's, under the same launch
        "identical_prompts": {mode: sum(first_divergence(a, b) is None for a, b in
                                        zip(run.tokens[f"{mode} drafter"], run.tokens[f"{mode} alone"]))
                              for mode in ("default", "exact")},
    }


def main(argv: list[str] | None = None) -> None:
    from dflash_gguf.runner.prompts import BUILTIN_PROMPTS, read_prompts

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--draft", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, default=None, help="prompts file (default: validate's built-in mix)")
    parser.add_argument("--count", type=int, default=6, help="how many of the prompts")
    parser.add_argument("-n", "--n-predict", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--llama-bin", type=Path, default=None, help="another build's bin folder")
    parser.add_argument("server_args", nargs="*", help="llama-server arguments (default: -t 1)")
    args = parser.parse_args(argv)
    prompts = (read_prompts(args.prompts) if args.prompts else list(BUILTIN_PROMPTS))[: args.count]
    report = measure(args.target, args.draft, prompts, args.n_predict, args.rounds, args.server_args or ["-t", "1"],
                     llama_bin=args.llama_bin)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
