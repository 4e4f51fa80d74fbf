"""What llama.cpp RPC costs per token on loopback: the target on the head against the target's layers
on two `ggml-rpc-server` processes on 127.0.0.1, with and without the drafter (on the head).

    .venv/bin/python -m benchmarks.rpc_cost [--target T --draft D] [--prompts 6] [-n 64] [--rounds 3] [-- -t 1]

Four servers run at once (serve's launch, one slot): local alone, local with the drafter, RPC alone,
RPC with the drafter (which follows --device: `-devd none` aborts, see launch.py); each RPC one has its own two
rpc-servers (an rpc-server serves one client at a time). Each round sends every prompt to
each of the four, one after the other (the order rotating by round), and reports per server the
milliseconds per generated token (the server's own `predicted_ms`); the RPC cost per token is the
RPC server's ms/token minus the local one's in the same round, the median over rounds. The outputs
of the RPC servers are compared token for token with the local ones.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
from pathlib import Path

from benchmarks.side_by_side import measure_side_by_side, progress

REPO = Path(__file__).resolve().parents[1]


def measure(target: Path, draft: Path, prompts: list[str], n_predict: int, rounds: int, server_args: list[str],
            backend: str = "cpu", llama_bin: Path | None = None, exact: bool = False) -> dict:
    from dflash_gguf.runner.measure import first_divergence
    from dflash_gguf.runner.build import find_bin_dir
    from dflash_gguf.runner.launch import launch_recipe
    from dflash_gguf.runner.rpc import RpcServer
    from dflash_gguf.runner.measure import measuring_launch
    from dflash_gguf.runner.prompts import tokenize_prompts

    bin_dir = find_bin_dir(backend, llama_bin)
    with contextlib.ExitStack() as stack:
        def workers() -> list[str]:
            return [stack.enter_context(RpcServer(bin_dir=bin_dir, threads=1, exact=exact)).address for _ in range(2)]

        local = measuring_launch(launch_recipe(target, draft, server_args=server_args, exact=exact), prompts,
                                 n_predict)
        head = list(server_args)
        rpc = workers()
        launches = {"local alone": local.alone(), "local + drafter": local,
                    "RPC alone": measuring_launch(launch_recipe(target, None, rpc=workers(), server_args=head,
                                                                exact=exact), prompts, n_predict),
                    "RPC + drafter": measuring_launch(launch_recipe(target, draft, rpc=rpc, server_args=head,
                                                                    exact=exact), prompts, n_predict)}
        servers = {name: stack.enter_context(l.server(bin_dir=bin_dir)) for name, l in launches.items()}
        progress(f"4 servers up; the target's layers over {', '.join(rpc)}")
        ids = tokenize_prompts(servers["local alone"].client, prompts)
        run = measure_side_by_side(servers, ids, n_predict, rounds)
    ms, tokens, accepted = run.ms, run.tokens, run.accepted
    cost_alone = [b - a for a, b in zip(ms["local alone"], ms["RPC alone"])]
    cost_spec = [b - a for a, b in zip(ms["local + drafter"], ms["RPC + drafter"])]
    same = all(first_divergence(a, b) is None for a, b in zip(tokens["RPC + drafter"], tokens["local alone"]))
    return {
        "prompts": len(ids), "n_predict": n_predict, "rounds": rounds, "server_args": server_args, "exact": exact,
        "ms_per_token": {name: round(statistics.median(v), 3) for name, v in ms.items()},
        "rpc_ms_per_token": {"target alone": round(statistics.median(cost_alone), 3),
                             "with drafter": round(statistics.median(cost_spec), 3)},
        "rpc_over_local": {"target alone": round(statistics.median(b / a for a, b in zip(ms["local alone"],
                                                                                       ms["RPC alone"])), 3),
                           "with drafter": round(statistics.median(b / a for a, b in zip(ms["local + drafter"],
                                                                                       ms["RPC + drafter"])), 3)},
        "accepted": {"local": accepted["local + drafter"], "RPC": accepted["RPC + drafter"]},
        "rpc_output_identical_to_local": same
        and all(first_divergence(a, b) is None for a, b in zip(tokens["RPC alone"], tokens["local alone"])),
    }


def main(argv: list[str] | None = None) -> None:
    from dflash_gguf.runner.prompts import read_prompts
    from training.fixtures.trained_gguf import trained_ggufs

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, default=None, help="another target GGUF (default: the trained pair's)")
    parser.add_argument("--draft", type=Path, default=None, help="its drafter GGUF (with --target)")
    parser.add_argument("--prompts", type=int, default=6, help="held-out prompts of the trained pair")
    parser.add_argument("-n", "--n-predict", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--exact", action="store_true", help="--exact on the head and on the rpc-servers")
    parser.add_argument("--llama-bin", type=Path, default=None, help="another build's bin folder")
    parser.add_argument("server_args", nargs="*", help="llama-server arguments (default: -t 1)")
    args = parser.parse_args(argv)
    pair = trained_ggufs()
    if (args.target is None) != (args.draft is None):
        parser.error("give --target and --draft together")
    target, draft = (args.target, args.draft) if args.target else (pair["target"], pair["dflash"])
    report = measure(target, draft, read_prompts(pair["prompts"])[: args.prompts], args.n_predict,
                     args.rounds, args.server_args or ["-t", "1"], llama_bin=args.llama_bin, exact=args.exact)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
