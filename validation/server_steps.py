"""The step boundaries llama-server used, read back from its debug log (`-lv 5`).

Every token a greedy run emits is the target's choice in one batch: the prompt's last row, then,
for each generation step, either one row (no draft) or the last emitted token followed by the
drafts (`#draft` + 1 rows at positions `pos_next`...), of which `accepted` drafts and one token of
the target's own are emitted. llama-server logs each of these at debug verbosity
(tools/server/server-context.cpp: `generate_draft`, `slot decode token`, `accepted N/M draft
tokens`), and patch 0003 the drafts themselves (`dflash draft:`), so the validator can evaluate the
very same batches again without the drafter (validation/replay.py).

Two more things decide what the target computed on recurrent, hybrid and sliding-window targets,
and the log has both:
- the prompt's batches: for such targets the server ends a prompt batch a few tokens before the
  prompt's end, to checkpoint there (server-context.cpp, `checkpoint_offsets`); each prompt batch
  logs `main/do_checkpoint = ..., pos_max = P` before it is decoded, P being the last position
  already in the cache;
- rollbacks through a checkpoint: where the target's memory cannot drop a step's rejected rows
  (no recurrent-state snapshots for them), the server saves the sequence's partial state before
  the verify batch, and when drafts are rejected it logs `restoring speculative checkpoint`, loads
  that state, drops the cache from `pos_max + 1` on and emits nothing; the next step verifies the
  tokens the target took (its `accepted` then counts one fewer than it took: `spec_is_replay`).

A tree step (patch 0009, `--spec-tree-budget N`) verifies a draft tree in one batch: the server logs
its nodes in batch order with their parents (`spec tree: ... tokens=[..] parents=[..]`, 0 the root,
node j at position `pos_next + depth(j)`) before the step's `generate_draft` line, and the nodes it
accepted (`spec tree accepted: ... path=[..]`) after it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

DEBUG_ARGS = ("-lv", "5")  # what the log needs: llama-server's debug verbosity

_SLOT = r"id\s+(?P<slot>\d+) \| task (?P<task>-?\d+) \| "
_DRAFT_STEP = re.compile(_SLOT + r"generate_draft: id=(?P<last>-?\d+), #tokens=\d+, #draft=(?P<n>\d+), "
                         r"pos_next=(?P<pos>\d+)")
_PLAIN_STEP = re.compile(_SLOT + r"slot decode token, id=(?P<last>-?\d+), n_ctx = \d+, n_tokens = (?P<pos>\d+)")
_ACCEPTED = re.compile(_SLOT + r"accepted (?P<a>\d+)/(?P<n>\d+) draft tokens, new n_tokens")
_DRAFTS = re.compile(r"dflash draft: seq_id=(?P<seq>\d+) pos=(?P<pos>\d+) id_last=-?\d+ n=\d+ ids=\[(?P<ids>[0-9,]*)\]")
_TOKEN = re.compile(_SLOT + r"n_gen = \d+, n_remaining = -?\d+, next token:\s*(?P<id>-?\d+)")  # every request emits one
_RESTORE = re.compile(_SLOT + r"restoring speculative checkpoint \(pos_min = -?\d+, pos_max = (?P<pos>-?\d+)")
_TREE = re.compile(r"spec tree: slot=(?P<slot>\d+) pos=(?P<pos>\d+) last=-?\d+ n=(?P<n>\d+) "
                   r"tokens=\[(?P<tokens>[0-9,]*)\] parents=\[(?P<parents>[0-9,]*)\]")
_TREE_PATH = re.compile(r"spec tree accepted: slot=(?P<slot>\d+) path=\[(?P<path>[0-9,]*)\]")
_TREE_MEMORY = re.compile(r"spec tree: budget=(?P<budget>\d+) n_seq_max=(?P<n_seq>\d+) kv_unified=(?P<unified>[01])")
_TREE_OFF = re.compile(r"spec tree: off: (?P<why>.*); verifying the chain")
_PROMPT_BATCH = re.compile(_SLOT + r"main/do_checkpoint = \w+, pos_min = -?\d+, pos_max = (?P<pos>-?\d+)")


@dataclass
class Step:
    """One batch of the target's: `width` rows from `position`, the first being `last`."""

    position: int
    width: int
    last: int
    drafts: list[int] = field(default_factory=list)  # as drafted (patch 0003), trimmed to width - 1
    proposed: list[int] = field(default_factory=list)  # the drafter's whole block (patch 0003), untrimmed
    accepted: int | None = None  # drafts accepted; None for a plain step, or a request's last step
    #                              when the request ended inside it (the server logs no count then)
    restored_from: int | None = None  # rolled back through the checkpoint: the cache from here on dropped
    replay: bool = False  # verifies again what the target took before a restore (its drafts: those tokens)
    parents: list[int] = field(default_factory=list)  # a tree step: each draft's parent (0: `last`, j: drafts[j-1])
    path: list[int] | None = None  # a tree step: the drafts it accepted (1-based), as the server logged them

    @property
    def is_tree(self) -> bool:
        return bool(self.parents)

    def depth(self, node: int) -> int:
        """Node `node`'s distance from the root (0 for the root, 1-based nodes)."""
        depth = 0
        while node:
            node, depth = self.parents[node - 1], depth + 1
        return depth

    def walk(self, tokens: Sequence[int]) -> list[int] | None:
        """The nodes (1-based) that carry `tokens` from the root down, one child per token; None when
        one of them is not a child of the node before it."""
        path, node = [], 0
        for token in tokens:
            child = next((j for j in range(1, len(self.parents) + 1)
                          if self.parents[j - 1] == node and self.drafts[j - 1] == token), None)
            if child is None:
                return None
            path.append(child)
            node = child
        return path

    def emitted(self, remaining: int) -> int:
        """Tokens of the request this step emitted, `remaining` being those not yet accounted for."""
        if self.restored_from is not None:
            return 0
        if self.width == 1:
            return min(1, remaining)
        if self.accepted is None:
            return min(self.width, remaining)
        # a replay step's count leaves out the one token it re-verified that the target chose itself
        return min(self.accepted + 1 + self.replay, remaining)


@dataclass
class TaskSteps:
    """Every generation step of one request (task), in order, and where its prompt batches began
    (empty when the log does not say)."""

    task: int
    slot: int
    steps: list[Step] = field(default_factory=list)
    prompt_batches: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # what the server emitted, by its own log

    @property
    def restores(self) -> int:
        return sum(step.restored_from is not None for step in self.steps)


def tree_state(log: Path) -> dict | None:
    """What a server asked for draft trees (--spec-tree-budget) said at start-up (patch 0009): its
    budget, sequences and KV layout when it verifies trees, why not when it verifies the chain
    instead; None when its log says neither (no tree asked)."""
    with open(log, encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if (m := _TREE_MEMORY.search(line)) is not None:
                return {"budget": int(m["budget"]), "n_seq_max": int(m["n_seq"]), "kv_unified": m["unified"] == "1"}
            if (m := _TREE_OFF.search(line)) is not None:
                return {"off": m["why"]}
    return None


def tree_memory(log: Path) -> tuple[int, bool] | None:
    """The target context's sequences and KV layout a server that verifies trees set itself; None
    when it verifies none."""
    state = tree_state(log)
    return (state["n_seq_max"], state["kv_unified"]) if state and "budget" in state else None


def read_steps(log: Path) -> list[TaskSteps]:
    """The requests of a llama-server debug log, in the order they started."""
    tasks: dict[int, TaskSteps] = {}
    pending_drafts: dict[int, tuple[int, list[int]]] = {}  # slot -> (pos, ids) of its latest draft
    pending_trees: dict[int, tuple[int, list[int], list[int]]] = {}  # slot -> (pos, tokens, parents)
    open_trees: dict[int, Step] = {}  # slot -> its tree step waiting for its path
    open_step: dict[int, Step] = {}  # task -> its draft step waiting for "accepted"
    with open(log, encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if (m := _TREE.search(line)) is not None:
                ids = [int(t) for t in m["tokens"].split(",") if t]
                parents = [int(t) for t in m["parents"].split(",") if t]
                if len(ids) == len(parents) == int(m["n"]):
                    pending_trees[int(m["slot"])] = (int(m["pos"]), ids, parents)
                continue
            if (m := _TREE_PATH.search(line)) is not None:
                step = open_trees.pop(int(m["slot"]), None)
                if step is not None:
                    step.path = [int(t) for t in m["path"].split(",") if t]
                continue
            if (m := _DRAFTS.search(line)) is not None:
                ids = [int(t) for t in m["ids"].split(",") if t]
                pending_drafts[int(m["seq"])] = (int(m["pos"]), ids)
                continue
            m = _DRAFT_STEP.search(line) or _PLAIN_STEP.search(line)
            if m is not None:
                task, slot = int(m["task"]), int(m["slot"])
                entry = tasks.setdefault(task, TaskSteps(task, slot))
                pos = int(m["pos"])
                if "n" in m.groupdict():
                    n = int(m["n"])
                    drafted = pending_drafts.pop(slot, None)
                    drafts = drafted[1][:n] if drafted is not None and drafted[0] == pos else []
                    previous = entry.steps[-1] if entry.steps else None
                    replay = previous is not None and previous.restored_from is not None
                    step = Step(pos, n + 1, int(m["last"]), drafts if len(drafts) == n else [],
                                drafted[1] if drafted is not None and drafted[0] == pos else [], replay=replay)
                    tree = pending_trees.pop(slot, None)
                    if tree is not None and tree[0] == pos and len(tree[1]) == n:
                        step.drafts, step.proposed, step.parents = tree[1], tree[1], tree[2]
                        open_trees[slot] = step
                    open_step[task] = step
                else:
                    step = Step(pos, 1, int(m["last"]))
                entry.steps.append(step)
                continue
            if (m := _TOKEN.search(line)) is not None:
                tasks.setdefault(int(m["task"]), TaskSteps(int(m["task"]), int(m["slot"]))).tokens.append(int(m["id"]))
                continue
            if (m := _ACCEPTED.search(line)) is not None:
                step = open_step.pop(int(m["task"]), None)
                if step is not None:
                    step.accepted = int(m["a"])
                continue
            if (m := _PROMPT_BATCH.search(line)) is not None:
                entry = tasks.setdefault(int(m["task"]), TaskSteps(int(m["task"]), int(m["slot"])))
                entry.prompt_batches.append(int(m["pos"]) + 1)
                continue
            if (m := _RESTORE.search(line)) is not None:
                step = open_step.pop(int(m["task"]), None)
                if step is not None:
                    step.restored_from = int(m["pos"]) + 1
    return [t for t in tasks.values() if t.task >= 0]
