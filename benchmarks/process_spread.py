"""How far apart two llama-server processes of one command run: pairs of target-alone servers (A/A).

Each pair: two servers of the same command started one after the other (the first alternating by pair),
warmed up, then `--rounds` interleaved rounds in which N clients load each in turn for `--seconds`.
Per pair: the rounds' ratios (the second server over the first) and their median. Any ratio away from
1 is the machine's, not a drafter's: the spread within a pair is what interleaving sees, the spread of
the pairs' medians is what one pair kept for a whole run carries into every round
(runner/speed.py RoundServers, `--fresh-servers`).

    python -m benchmarks.process_spread [--pair trained] [--streams 1] [--seconds 3] [--rounds 4] [--pairs 8]

JSON on stdout, progress on stderr; docs/speed.md#fresh-servers shows the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter

from dflash_gguf.runner.build import find_bin_dir
from dflash_gguf.runner.server import LlamaServer
from dflash_gguf.runner.speed import RoundServers, median_interval
from benchmarks.prompt_sets import pair_files, prompt_set
from benchmarks.side_by_side import progress
from benchmarks.streams import load


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="trained", choices=("trained", "memory-bound", "smollm2"))
    parser.add_argument("--type", default="F16", help="target type (smollm2: F16, Q8_0, Q4_K_M)")
    parser.add_argument("--set", default="held-out", help="prompt set (benchmarks/prompt_sets.py)")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=3.0, help="one server's share of a round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per pair")
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("-n", "--n-predict", type=int, default=48)
    args = parser.parse_args(argv)

    target, prompts, bin_dir = pair_files(args.pair)[args.type], prompt_set(args.set, args.prompts), find_bin_dir(None, None)
    command = ["-t", "1", "--parallel", str(args.streams), "-c", str(1024 * args.streams)]
    maker = lambda: LlamaServer(target, command, bin_dir=bin_dir)  # noqa: E731

    def warm_up(server: LlamaServer) -> None:
        for prompt in prompts[:max(args.streams, 2)]:
            server.client.complete(prompt, 16, cache_prompt=False)

    pairs = []
    for p in range(args.pairs):
        rates: dict[str, list[float]] = {"first": [], "second": []}
        # RoundServers starts its makers in the order of its round number: `p` alternates which is first
        with RoundServers({"a": maker, "b": maker}, False, warm_up) as servers:
            started = servers.servers(p)
            first, second = ("a", "b") if p % 2 == 0 else ("b", "a")
            for r in range(args.rounds):
                for name in ((first, second) if r % 2 == 0 else (second, first)):
                    rate = load(started[name], prompts, args.streams, args.seconds, args.n_predict, Counter())
                    rates["first" if name == first else "second"].append(rate)
        ratios = [b / a for a, b in zip(rates["first"], rates["second"])]
        pairs.append({"ratios": [round(x, 3) for x in ratios], "median": round(statistics.median(ratios), 3)})
        progress(f"pair {p + 1}: second / first started " + " ".join(f"{x:.3f}" for x in ratios)
                 + f", median {statistics.median(ratios):.3f}")
    every = [x for pair in pairs for x in pair["ratios"]]
    medians = [pair["median"] for pair in pairs]
    summary = {"pair_medians_range": [min(medians), max(medians)],
               "rounds_range": [min(every), max(every)], "median_of_all_rounds": round(statistics.median(every), 3),
               "interval_of_the_median": [round(x, 3) for x in median_interval(every)]}
    progress(f"pair medians {min(medians):.3f}-{max(medians):.3f}; all {len(every)} rounds "
             f"{min(every):.3f}-{max(every):.3f}, median {summary['median_of_all_rounds']}")
    print(json.dumps({"pair": args.pair, "type": args.type, "streams": args.streams, "seconds": args.seconds,
                      "rounds": args.rounds, "n_predict": args.n_predict, "pairs": pairs, **summary}, indent=1))


if __name__ == "__main__":
    main()
