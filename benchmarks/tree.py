"""Draft trees against the chain, side by side: accepted tokens per target step (tau) and speed.

For each target type, drafter and prompt set, one server per setting, all up together (the target
alone; the chain at the drafter's whole length; a tree of as many nodes as the chain verifies, so
both verify batches are as wide; trees of 8, 16 and 32 nodes, each at that length), and each round
sends every prompt to each server in turn, the order rotating by round (benchmarks/side_by_side.py).
Reported per set: tau of each (tokens per verify step, from the responses' draft counts), each
tree's tau over the chain's, tokens/s and each setting over the target alone and over the chain
(judged by runner/speed.py: withheld above tau or when the rounds spread wider than the effect),
and whether every setting's tokens equal the target alone's.

    python -m benchmarks.tree [--pair smollm2|trained|memory-bound] [--types F16] [--drafters dflash2,dflash]
                              [--sets chat,code] [--budgets 8,16,32] [--rounds 3] [--n-predict 64] [--prompts 8]
                              [--floors 0.1,0.2] [--chain '--spec-draft-n-max 4 --spec-draft-p-min 0.8']

`--floors` adds, for each budget, a tree that stops at that path probability (--spec-tree-p-min, patch 0017);
`--chain` gives the chain the flags tune found best instead of the drafter's whole length.

`chat` is SmolLM2's held-out chat prompts; `code` and `rewrite` come from benchmarks/prompts/; a
public suite's name (`writingbench`, `mt-bench`, ...: validation/suites.py) draws its rows; with
`--pair trained` (the committed trained pair, `make fixtures`: build/fixtures/trained/) or `memory-bound`
(its target widened by inert FFN units, benchmarks/regimes.py) the set is its held-out prompts (`held-out`).
JSON on stdout, progress on stderr; docs/speed.md#draft-trees shows the table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path

from dflash_gguf.runner.build import find_bin_dir
from dflash_gguf.runner.launch import launch_recipe, read_draft
from dflash_gguf.runner.measure import mean_acceptance_length
from dflash_gguf.runner.prompts import tokenize_prompts
from dflash_gguf.runner.speed import judge, shown
from benchmarks.side_by_side import measure_side_by_side, progress
from benchmarks.prompt_sets import pair_files, prompt_set

ALONE, CHAIN = "alone", "chain"


def settings(draft: Path, budgets: list[int], floors: list[float] = ()) -> dict[str, tuple[int, float]]:
    """Each drafting server's (tree budget, path probability floor) by name (0: the chain; 0.0: no floor)."""
    longest = read_draft(draft).draft_length
    trees = {f"tree {b}": (b, 0.0) for b in sorted({longest, *budgets})}
    floored = {f"tree {b} floor {f:g}": (b, f) for b in sorted(budgets) for f in floors}
    return {CHAIN: (0, 0.0), **trees, **floored}


def tau(answers: list) -> float:
    produced = sum(c.n_predicted for c in answers)
    accepted = sum(c.draft_n_accepted for c in answers)
    return mean_acceptance_length(produced, accepted, len(answers))


def measure(target: Path, draft: Path, texts: list, budgets: list[int], rounds: int, n_predict: int,
            bin_dir: Path, floors: list[float] = (), chain_args: list[str] = ()) -> dict:
    with contextlib.ExitStack() as stack:
        launches = {ALONE: launch_recipe(target, None, server_args=["-c", "4096"])}
        for name, (budget, floor) in settings(draft, budgets, floors).items():
            tree = ["--spec-tree-budget", str(budget)] if budget else list(chain_args)
            tree += ["--spec-tree-p-min", f"{floor:g}"] if floor else []
            launches[name] = launch_recipe(target, draft, server_args=["-c", "4096", *tree], check=False)
        servers = {name: stack.enter_context(launch.server(bin_dir=bin_dir)) for name, launch in launches.items()}
        ids = tokenize_prompts(servers[ALONE].client, texts)
        for server in servers.values():
            server.client.complete(ids[0][:8], 4, cache_prompt=False)
        out = measure_side_by_side(servers, ids, n_predict, rounds)
    answers, names = out.answers, list(out.ms)
    per_round = {n: [1000.0 / x for x in v] for n, v in out.ms.items()}
    taus = {n: round(tau(answers[n]), 3) for n in names if n != ALONE}

    def judged(name: str, against: str) -> dict:
        """`name` over `against`, per round, as runner/speed.py judges it: bounded by `name`'s tau over the
        target alone; against the chain no bound holds (a tree step costs what its own width costs)."""
        ratios = [x / y for x, y in zip(per_round[name], per_round[against])]
        return judge(ratios, taus[name] if against == ALONE else None).to_dict()

    trees = [n for n in names if n.startswith("tree ")]
    return {"tau": taus,
            "tau_over_chain": {n: round(taus[n] / taus[CHAIN], 3) for n in trees},
            "tokens_per_second": {n: round(statistics.median(v), 2) for n, v in per_round.items()},
            "over_alone": {n: judged(n, ALONE) for n in names if n != ALONE},
            "over_chain": {n: judged(n, CHAIN) for n in trees},
            "nodes_verified": {n: sum(c.draft_n for c in answers[n]) for n in names if n != ALONE},
            "identical": {n: [c.tokens for c in answers[n]] == [c.tokens for c in answers[ALONE]]
                          for n in names if n != ALONE},
            "rounds": rounds, "prompts": len(ids), "n_predict": n_predict}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=("smollm2", "trained", "memory-bound"), default="smollm2")
    parser.add_argument("--types", default="F16")
    parser.add_argument("--drafters", default="dflash2,dflash")
    parser.add_argument("--sets", default="chat")
    parser.add_argument("--budgets", default="8,16,32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n-predict", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--floors", default="", help="path probability floors (--spec-tree-p-min): a tree of each "
                        "budget at each floor as well")
    parser.add_argument("--chain", default="", help="the chain's own flags, e.g. '--spec-draft-n-max 4 "
                        "--spec-draft-p-min 0.8' (what tune found best); default: the drafter's whole length")
    args = parser.parse_args(argv)
    floors = [float(f) for f in args.floors.split(",")] if args.floors else []
    files = pair_files(args.pair)
    budgets = [int(b) for b in args.budgets.split(",")]
    bin_dir = find_bin_dir(None, None)
    rows = []
    for qtype in args.types.split(","):
        for drafter in args.drafters.split(","):
            for name in args.sets.split(","):
                progress(f"{qtype} {drafter} {name}")
                row = measure(files[qtype], files[drafter], prompt_set(name, args.prompts), budgets, args.rounds,
                              args.n_predict, bin_dir, floors, args.chain.split())
                rows.append({"pair": args.pair, "type": qtype, "drafter": drafter, "set": name, **row})
                progress(f"{qtype} {drafter} {name}: tau {row['tau']}; over the chain "
                         + ", ".join(f"{n} {shown(v)}" for n, v in row["over_chain"].items()))
    json.dump({"rows": rows}, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
