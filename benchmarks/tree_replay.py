"""How a draft-tree rule would accept, without a server: the drafter's candidates replayed against the target.

For every position of the target's greedy output (the target alone's llama-server, F16), the z-lab
PyTorch reference drafts the block the server's drafter would draft there (the same context, float32)
and keeps its candidates: DFlash, the top 16 tokens with their log-probabilities over the whole
vocabulary; DFlash 2, the selector's 8 candidates per position and its transition scores from each
candidate before. A rule builds a tree from them (best-first by the product of probabilities along the
path, as patch 0009 does, under a node budget) and the replay walks it with the target's own tokens:
the step accepts the longest path of them, and the next step starts after it, as the server's does
(greedy, so the block at a position depends only on the tokens before it). The sum is tau, the tokens
per target step, beside the chain's and beside the bound no tree drawn from the same candidates can pass
(the target's tokens followed as deep as the candidates hold them, whatever the budget).

Rules: DFlash `renormalised` (the top 10 with probabilities renormalised over them: patch 0009 before
2026-12-06) and `vocabulary` (the top 10 with their probabilities over the whole vocabulary: the patch
now); DFlash 2 `selector T` (the softmax of the transition scores at temperature T; the patch uses 2).

    python -m benchmarks.tree_replay [--pair smollm2|trained] [--drafters dflash2,dflash] [--sets chat]
                                     [--budgets 8,16,32] [--prompts 8] [--n-predict 64]
                                     [--floors 0.05,0.1,0.2 --p-mins 0,0.4,0.8]

`--floors` replays the patch's rule at each budget stopped at each path probability floor (--spec-tree-p-min,
patch 0017), beside the chain cut at each p_min: tau and the drafted tokens verified per step of each.

JSON on stdout (per drafter and set: tau of the chain, of each rule and budget, the bound); progress on
stderr. Reference extra needed (`pip install -e .[reference]`). docs/speed.md#draft-trees uses it.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from pathlib import Path

import numpy as np

from dflash_gguf.runner.build import find_bin_dir
from dflash_gguf.runner.launch import launch_recipe, read_draft
from dflash_gguf.runner.prompts import tokenize_prompts
from dflash_gguf.validation.draft_parity import context_features, drafted_states
from dflash_gguf.validation.reference import drafter_class, load_target
from benchmarks.prompt_sets import TRAINED, pair_files, prompt_set
from benchmarks.side_by_side import progress
from training.fixtures.smollm2 import COMMITTED, hf_target

TOP = 16             # DFlash candidates kept per position (the tree takes 10, the bound all 16)
TREE_TOP = 10
SELECTOR_TEMPS = (1.0, 1.5, 2.0, 2.5)
PATCH_RULE = {False: "vocabulary", True: "selector 2"}  # the rule patch 0009 builds its trees by (DFlash, DFlash 2)


def hf_folders(pair: str) -> tuple[Path, Path]:
    """(the HF target, the folder holding the HF drafters) of a pair."""
    if pair == "trained":
        return TRAINED.parents[2] / "tests" / "fixtures" / "trained" / "target", \
            TRAINED.parents[2] / "tests" / "fixtures" / "trained"
    return hf_target(), COMMITTED


def greedy_outputs(target_gguf: Path, texts: list, n_tokens: int) -> tuple[list, list]:
    """The prompts' token ids and the target alone's greedy tokens for each."""
    launch = launch_recipe(target_gguf, None, server_args=["-c", "4096", "-t", "1"])
    with launch.server(bin_dir=find_bin_dir(None, None)) as server:
        ids = tokenize_prompts(server.client, texts)
        return ids, [server.client.complete(p, n_tokens, cache_prompt=False).tokens for p in ids]


def lattices(draft_dir: Path, target_dir: Path, ids: list, outputs: list, n_draft: int, n_predict: int) -> list:
    """Per prompt, per output position j: what the drafter offers for outputs[j], outputs[j+1], ...
    (anchor outputs[j-1], the context before it)."""
    # extra: [reference] (PyTorch, transformers, the z-lab model)
    import torch
    from dflash.model import _output_head

    target = load_target(target_dir, torch.float32)
    draft = drafter_class(draft_dir).from_pretrained(str(draft_dir), dtype=torch.float32).eval()
    head, selector = _output_head(target), getattr(draft, "candidate_selector", None)
    per_prompt = []
    for prompt, out in zip(ids, outputs):
        sequence = list(prompt) + list(out)
        features = context_features(draft, target, sequence)
        steps = []
        for p in range(len(prompt) + 1, len(prompt) + min(n_predict, len(out))):
            with torch.inference_mode():
                states = drafted_states(draft, target, sequence[:p - 1], sequence[p - 1], n_draft, features)
                logits = draft.compute_logits(states[None], head)[0].float()
                if selector is None:
                    top = torch.log_softmax(logits, -1).topk(TOP, -1)
                    steps.append({"tok": top.indices.numpy(), "logp": top.values.numpy()})
                    continue
                unary, cand = logits.topk(selector.top_k, -1)
                hidden = selector.hidden_projection(states)
                trans = []
                for i in range(n_draft):
                    before = torch.tensor([sequence[p - 1]]) if i == 0 else cand[i - 1]
                    pair = selector.predecessor_codebook(before) * hidden[i]
                    trans.append((unary[i][None] + pair @ selector.successor_codebook(cand[i]).T).numpy())
                steps.append({"tok": cand.numpy(), "trans": trans})
        per_prompt.append(steps)
    return per_prompt


def children(step: dict, rule: str, depth: int, c_parent: int) -> list[tuple[int, float, int]]:
    """(token, probability given the parent, candidate index), best first, at a 0-based block depth."""
    if "trans" in step:
        temp = float(rule.split()[1])
        scores = np.asarray(step["trans"][depth][0 if depth == 0 else c_parent], dtype=np.float64) / temp
        p = np.exp(scores - scores.max())
        p /= p.sum()
        return [(int(step["tok"][depth][k]), float(p[k]), int(k)) for k in np.argsort(-p, kind="stable")]
    logp = np.asarray(step["logp"][depth][:TREE_TOP], dtype=np.float64)
    p = np.exp(logp) if rule == "vocabulary" else np.exp(logp - logp.max()) / np.exp(logp - logp.max()).sum()
    return [(int(step["tok"][depth][k]), float(p[k]), k) for k in range(len(p))]


def tree(step: dict, rule: str, budget: int, max_depth: int, floor: float = 0.0) -> dict[tuple[int, int], int]:
    """The best-first tree as {(parent node, token): node}, the way patch 0009 grows it (and 0017 stops it
    where the best path left is below `floor`)."""
    nodes = [(0, 0, 1.0)]  # depth, candidate index, score; node 0 is the root
    kids_of: dict = {}
    edges: dict = {}

    def kids(j: int):
        depth, c, _ = nodes[j]
        key = (depth, c if "trans" in step else 0)
        if key not in kids_of:
            kids_of[key] = children(step, rule, depth, c)
        return kids_of[key]

    heap = [(-kids(0)[0][1], 0, 0, 0)]
    pushed = 1
    while heap and len(nodes) - 1 < budget and -heap[0][0] >= floor:
        score, _, parent, rank = heapq.heappop(heap)
        token, _, c = kids(parent)[rank]
        nodes.append((nodes[parent][0] + 1, c, -score))
        edges[(parent, token)] = j = len(nodes) - 1
        if nodes[j][0] < max_depth:
            heapq.heappush(heap, (score * kids(j)[0][1], pushed, j, 0))
            pushed += 1
        if rank + 1 < len(kids(parent)):
            heapq.heappush(heap, (-nodes[parent][2] * kids(parent)[rank + 1][1], pushed, parent, rank + 1))
            pushed += 1
    return edges


def accepted_by_tree(rule: str, budget: int, max_depth: int, floor: float = 0.0):
    def accept(step: dict, truth: list[int]) -> tuple[int, int]:
        edges, node, n = tree(step, rule, budget, max_depth, floor), 0, 0
        for token in truth:
            node = edges.get((node, token))
            if node is None:
                break
            n += 1
        return n, len(edges)
    return accept


def accepted_by_chain(max_depth: int, p_min: float = 0.0):
    """The chain of first choices, cut where the first choice's probability is below `p_min` as the server's
    chain cuts it (DFlash: over the top-k sampler's ten; DFlash 2: the selector's softmax at temperature 1)."""
    def accept(step: dict, truth: list[int]) -> tuple[int, int]:
        c, width, n = 0, 0, None
        for depth in range(max_depth):
            first, p, c = children(step, "selector 1" if "trans" in step else "renormalised", depth, c)[0]
            if p < p_min:
                break
            width += 1
            if n is None and (depth >= len(truth) or first != truth[depth]):
                n = depth
        return min(width, len(truth)) if n is None else n, width
    return accept


def accepted_by_bound(max_depth: int):
    """The target's tokens followed as deep as the candidates hold them: no tree from them accepts more."""
    def accept(step: dict, truth: list[int]) -> tuple[int, int]:
        c = 0
        for depth, token in enumerate(truth[:max_depth]):
            if "trans" in step:
                hit = [k for k, t in enumerate(step["tok"][depth]) if t == token]
                if not hit:
                    return depth, 0
                c = hit[0]
            elif token not in step["tok"][depth]:
                return depth, 0
        return min(len(truth), max_depth), 0
    return accept


def replay(per_prompt: list, outputs: list, accept, n_predict: int) -> tuple[float, float]:
    """(tokens per target step, drafted tokens verified per step) over the prompts, each step accepting what
    `accept` says and one more."""
    steps = tokens = verified = 0
    for lattice, out in zip(per_prompt, outputs):
        out, j = out[:n_predict], 1
        while j < len(out) and j - 1 < len(lattice):
            n, width = accept(lattice[j - 1], out[j:])
            n = min(n, len(out) - j)
            steps, tokens, verified, j = steps + 1, tokens + n + 1, verified + width, j + n + 1
    return tokens / steps, verified / steps


def replay_tau(per_prompt: list, outputs: list, accept, n_predict: int) -> float:
    return replay(per_prompt, outputs, accept, n_predict)[0]


def floors_row(per_prompt: list, outputs: list, rule: str, depth: int, budgets: list[int], floors: list[float],
               p_mins: list[float], n_predict: int) -> dict:
    """tau and nodes verified per step of the patch's rule at each budget and path probability floor
    (--spec-tree-p-min), beside the chain at each p_min: what a floor saves against what it loses."""
    def shown(result: tuple[float, float]) -> dict:
        return {"tau": round(result[0], 3), "verified": round(result[1], 2)}
    return {"chain": {f"{p:g}": shown(replay(per_prompt, outputs, accepted_by_chain(depth, p), n_predict))
                      for p in p_mins},
            "tree": {f"{b} {f:g}": shown(replay(per_prompt, outputs, accepted_by_tree(rule, b, depth, f), n_predict))
                     for b in budgets for f in floors}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=("smollm2", "trained"), default="smollm2")
    parser.add_argument("--drafters", default="dflash2,dflash")
    parser.add_argument("--sets", default="chat")
    parser.add_argument("--budgets", default="8,16,32")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n-predict", type=int, default=64)
    parser.add_argument("--floors", default="", help="path probability floors (--spec-tree-p-min) to replay "
                        "with the patch's rule at each budget, beside the chain at --p-mins: tau and nodes per step")
    parser.add_argument("--p-mins", default="0,0.2,0.4,0.6,0.8")
    args = parser.parse_args(argv)
    files, (target_dir, drafters_dir) = pair_files(args.pair), hf_folders(args.pair)
    budgets = [int(b) for b in args.budgets.split(",")]
    rows = []
    for name in args.sets.split(","):
        ids, outputs = greedy_outputs(files["F16"], prompt_set(name, args.prompts), args.n_predict + 16)
        for drafter in args.drafters.split(","):
            progress(f"{args.pair} {drafter} {name}: drafting at every position")
            depth = read_draft(files[drafter]).draft_length
            per_prompt = lattices(drafters_dir / drafter, target_dir, ids, outputs, depth, args.n_predict)
            rules = ([f"selector {t:g}" for t in SELECTOR_TEMPS] if "trans" in per_prompt[0][0]
                     else ["renormalised", "vocabulary"])
            chain = replay_tau(per_prompt, outputs, accepted_by_chain(depth), args.n_predict)
            row = {"pair": args.pair, "drafter": drafter, "set": name, "depth": depth, "chain": round(chain, 3),
                   "bound": round(replay_tau(per_prompt, outputs, accepted_by_bound(depth), args.n_predict), 3),
                   "trees": {rule: {b: round(replay_tau(per_prompt, outputs, accepted_by_tree(rule, b, depth),
                                                        args.n_predict), 3) for b in budgets} for rule in rules}}
            row["over_chain"] = {rule: {b: round(t / chain, 3) for b, t in taus.items()}
                                 for rule, taus in row["trees"].items()}
            row["bound_over_chain"] = round(row["bound"] / chain, 3)
            if args.floors:
                row["floors"] = floors_row(per_prompt, outputs, PATCH_RULE["trans" in per_prompt[0][0]], depth, budgets,
                                           [float(f) for f in args.floors.split(",")],
                                           [float(p) for p in args.p_mins.split(",")], args.n_predict)
            rows.append(row)
            progress(f"{args.pair} {drafter} {name}: chain {row['chain']}, bound {row['bound_over_chain']}x; "
                     + "; ".join(f"{r} {v}" for r, v in row["over_chain"].items()))
    json.dump({"rows": rows, "prompts": args.prompts, "n_predict": args.n_predict}, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
