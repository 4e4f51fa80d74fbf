"""Several llama-servers measured side by side: every prompt sent to each in turn, the order rotating
by round, so that each round's figures share the machine's state (used by rpc_cost, exact_cost)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from dflash_gguf.runner.speed import RoundServers


def progress(msg: str) -> None:
    """On stderr: stdout carries the benchmark's JSON."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class SideBySide:
    """Per server: milliseconds per generated token of each round (the server's own `predicted_ms`),
    the first round's tokens per prompt and accepted draft tokens, and every round's answers."""

    ms: dict[str, list[float]] = field(default_factory=dict)
    tokens: dict[str, list[list[int]]] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    answers: dict[str, list] = field(default_factory=dict)


def measure_side_by_side(servers: dict | RoundServers, ids: list[list[int]], n_predict: int, rounds: int) -> SideBySide:
    """`servers`: name -> started LlamaServer, or the RoundServers giving each round's; `ids`: the
    prompts as token ids (greedy, no prompt cache)."""
    of_round = servers.servers if isinstance(servers, RoundServers) else lambda r: servers
    names = list(servers.makers if isinstance(servers, RoundServers) else servers)
    out = SideBySide({n: [] for n in names}, {n: [] for n in names}, {n: 0 for n in names}, {n: [] for n in names})
    for r in range(rounds):
        current = of_round(r)
        order = names[r % len(names):] + names[:r % len(names)]
        per_round = {name: [0.0, 0] for name in names}
        for prompt in ids:
            for name in order:
                c = current[name].client.complete(prompt, n_predict, temperature=0.0, seed=0, cache_prompt=False)
                per_round[name][0] += float(c.timings.get("predicted_ms", 0.0))
                per_round[name][1] += c.n_predicted
                out.answers[name].append(c)  # every round's: a server that adapts (auto) changes across rounds
                if r == 0:
                    out.tokens[name].append(c.tokens)
                    out.accepted[name] += c.draft_n_accepted
        for name, (t, n) in per_round.items():
            out.ms[name].append(t / n if n else 0.0)
        progress("round %d: %s" % (r + 1, ", ".join(f"{n} {out.ms[n][-1]:.2f} ms/token" for n in names)))
    return out
