"""The draft-length controller at several streams, against the target alone and against other builds.

All servers up together (the target alone, `--spec-draft-n-max auto` of this build, and auto of each
`--other-build`), each with -np N. A round gives each server in turn the same load: N client
threads, each sending the set's prompts one request after another for `--seconds`; the order of the
servers alternates by round. Per server: median tokens/s over the rounds, and its ratio to the
target alone round by round (median and range; judged by runner/speed.py). Fast targets need rounds
of seconds, not one pass over a few prompts: the trained pair answers 48 tokens in ~30 ms.

    python -m benchmarks.streams [--pair trained] [--drafter dflash2] [--set held-out] [--streams 8]
                                 [--seconds 6] [--rounds 8] [--n-predict 48] [--fresh] [--other-build NAME=BIN_DIR]

JSON on stdout, progress on stderr; docs/speed.md#several-streams shows the tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections import Counter
from pathlib import Path

from dflash_gguf.runner.build import find_bin_dir
from dflash_gguf.runner.measure import mean_acceptance_length
from dflash_gguf.runner.server import LlamaServer
from dflash_gguf.runner.speed import RoundServers, judge, shown
from benchmarks.prompt_sets import pair_files, prompt_set
from benchmarks.side_by_side import progress


def load(server: LlamaServer, prompts: list, streams: int, seconds: float, n_predict: int, seen: Counter) -> float:
    """Aggregate tokens/s of `streams` clients sending `prompts` round-robin for `seconds`; `seen`
    counts the answers' tokens, drafted and accepted tokens and requests (for tau)."""
    stop = time.monotonic() + seconds
    counts = [0] * streams
    lock = threading.Lock()

    def client(i: int) -> None:
        k = i
        while time.monotonic() < stop:
            answer = server.client.complete(prompts[k % len(prompts)], n_predict, cache_prompt=False)
            counts[i] += answer.n_predicted
            with lock:
                seen.update(produced=answer.n_predicted, accepted=answer.draft_n_accepted, requests=1,
                            parked=(answer.timings.get("draft_n_chosen_hist") or [0])[0],
                            steps=sum(answer.timings.get("draft_n_chosen_hist") or []))
            k += streams

    start = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="trained", choices=("trained", "memory-bound", "smollm2"))
    parser.add_argument("--type", default="F16", help="target type (smollm2: F16, Q8_0, Q4_K_M)")
    parser.add_argument("--drafter", default="dflash2", choices=("dflash", "dflash2"))
    parser.add_argument("--set", default="held-out", help="prompt set (benchmarks/prompt_sets.py)")
    parser.add_argument("--prompts", type=int, default=12, help="prompts drawn from the set")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=6.0, help="length of one server's share of a round")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("-n", "--n-predict", type=int, default=48)
    parser.add_argument("--fresh", action="store_true",
                        help="new server processes for every round (runner/speed.py RoundServers: a process's own "
                             "speed then lands in the rounds' spread)")
    parser.add_argument("--other-build", action="append", default=[], metavar="NAME=BIN_DIR",
                        help="also auto on another build's llama-server (repeatable)")
    args = parser.parse_args()

    files = pair_files(args.pair)
    prompts = prompt_set(args.set, args.prompts)
    bins = {"auto": find_bin_dir(None, None)}
    for spec in args.other_build:
        name, _, bin_dir = spec.partition("=")
        bins[f"auto, {name}"] = Path(bin_dir)
    common = ["-t", "1", "--parallel", str(args.streams), "-c", str(1024 * args.streams)]
    auto = ["-md", str(files[args.drafter]), "--spec-type", "draft-dflash", "--spec-draft-n-max", "auto"]
    makers = {"alone": lambda: LlamaServer(files[args.type], common, bin_dir=bins["auto"])}
    for name, bin_dir in bins.items():
        makers[name] = lambda bin_dir=bin_dir: LlamaServer(files[args.type], common + auto, bin_dir=bin_dir)
    rates: dict[str, list[float]] = {name: [] for name in makers}
    seen: dict[str, Counter] = {name: Counter() for name in makers}

    def warm_up(server: LlamaServer) -> None:  # weights touched, the controller calibrated, acceptance learned
        for prompt in prompts[:args.streams]:
            server.client.complete(prompt, args.n_predict, cache_prompt=False)

    with RoundServers(makers, args.fresh, warm_up) as round_servers:
        for r in range(args.rounds):
            servers = round_servers.servers(r)
            for name in list(makers)[r % len(makers):] + list(makers)[:r % len(makers)]:
                rates[name].append(load(servers[name], prompts, args.streams, args.seconds, args.n_predict, seen[name]))
            progress(f"round {r + 1}: " + ", ".join(f"{n} {v[-1]:.0f}" for n, v in rates.items()) + " tok/s")
    rows = []
    for name, values in rates.items():
        row = {"server": name, "tokens_per_s": round(statistics.median(values), 1)}
        if name != "alone":
            ratios = [v / a for v, a in zip(values, rates["alone"])]
            c = seen[name]
            tau = mean_acceptance_length(c["produced"], c["accepted"], c["requests"])
            speed = judge(ratios, tau).to_dict()  # a ratio above tau is a measuring error: withheld, not shown
            row.update(tau=round(tau, 3), parked=round(c["parked"] / c["steps"], 4) if c["steps"] else None,
                       median=speed["speedup"], range=speed["speedup_range"], interval=speed["speedup_interval"],
                       judged=shown(speed),
                       median_of_rounds_below_tau=round(statistics.median(ratios), 3) if max(ratios) <= tau else None)
        rows.append(row)
        progress(f"{name}: {row['tokens_per_s']} tok/s" + (f", tau {row['tau']}, {row['judged']}" if name != "alone" else ""))
    print(json.dumps({"pair": args.pair, "type": args.type, "drafter": args.drafter, "set": args.set,
                      "streams": args.streams, "seconds": args.seconds, "rounds": args.rounds, "fresh": args.fresh,
                      "n_predict": args.n_predict, "servers": rows}, indent=1))


if __name__ == "__main__":
    main()
