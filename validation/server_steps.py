"""The step boundaries llama-server used, read back from its debug log (`-lv 5`).

Every token a greedy run emits is the target's choice in one batch: the prompt's last row, then,
for each generation step, either one row (no draft) or the last emitted token followed by the
drafts (`#draft` + 1 rows at positions `pos_next`...), of which `accepted` drafts and one token of
the target's own are emitted. llama-server logs each of these at debug verbosity
(tools/server/server-context.cpp: `generate_draft`, `slot decode token`, `accepted N/M draft
tokens`), and patch 0003 the drafts themselves (`dflash draft:`), so the validator can evaluate the
very same batches again without the drafter (validation/replay.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

DEBUG_ARGS = ("-lv", "5")  # what the log needs: llama-server's debug verbosity

_SLOT = r"id\s+(?P<slot>\d+) \| task (?P<task>-?\d+) \| "
_DRAFT_STEP = re.compile(_SLOT + r"generate_draft: id=(?P<last>-?\d+), #tokens=\d+, #draft=(?P<n>\d+), "
                         r"pos_next=(?P<pos>\d+)")
_PLAIN_STEP = re.compile(_SLOT + r"slot decode token, id=(?P<last>-?\d+), n_ctx = \d+, n_tokens = (?P<pos>\d+)")
_ACCEPTED = re.compile(_SLOT + r"accepted (?P<a>\d+)/(?P<n>\d+) draft tokens, new n_tokens")
_DRAFTS = re.compile(r"dflash draft: seq_id=(?P<seq>\d+) pos=(?P<pos>\d+) id_last=-?\d+ n=\d+ ids=\[(?P<ids>[0-9,]*)\]")
_TOKEN = re.compile(_SLOT + r"n_gen = \d+, n_remaining = -?\d+, next token:")  # every request emits one
_RESTORE = re.compile(_SLOT + r"restoring speculative checkpoint")


@dataclass
class Step:
    """One batch of the target's: `width` rows from `position`, the first being `last`."""

    position: int
    width: int
    last: int
    drafts: list[int] = field(default_factory=list)  # as drafted (patch 0003), trimmed to width - 1
    accepted: int | None = None  # drafts accepted; None for a plain step, or a request's last step
    #                              when the request ended inside it (the server logs no count then)

    def emitted(self, remaining: int) -> int:
        """Tokens of the request this step emitted, `remaining` being those not yet accounted for."""
        if self.width == 1:
            return min(1, remaining)
        return min(self.accepted + 1, remaining) if self.accepted is not None else min(self.width, remaining)


@dataclass
class TaskSteps:
    """Every generation step of one request (task), in order; `restored` when the server rolled a
    step back through a checkpoint (recurrent or SWA targets), which a replay does not follow."""

    task: int
    slot: int
    steps: list[Step] = field(default_factory=list)
    restored: bool = False


def read_steps(log: Path) -> list[TaskSteps]:
    """The requests of a llama-server debug log, in the order they started."""
    tasks: dict[int, TaskSteps] = {}
    pending_drafts: dict[int, tuple[int, list[int]]] = {}  # slot -> (pos, ids) of its latest draft
    open_step: dict[int, Step] = {}  # task -> its draft step waiting for "accepted"
    with open(log, encoding="utf-8", errors="replace") as lines:
        for line in lines:
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
                    step = Step(pos, n + 1, int(m["last"]), drafts if len(drafts) == n else [])
                    open_step[task] = step
                else:
                    step = Step(pos, 1, int(m["last"]))
                entry.steps.append(step)
                continue
            if (m := _TOKEN.search(line)) is not None:
                tasks.setdefault(int(m["task"]), TaskSteps(int(m["task"]), int(m["slot"])))
                continue
            if (m := _ACCEPTED.search(line)) is not None:
                step = open_step.pop(int(m["task"]), None)
                if step is not None:
                    step.accepted = int(m["a"])
                continue
            if (m := _RESTORE.search(line)) is not None and int(m["task"]) in tasks:
                tasks[int(m["task"])].restored = True
    return [t for t in tasks.values() if t.task >= 0]
