"""Measuring a server on prompts, shared by validate and tune: the room
every slot needs, the answers of one server, and the acceptance maths."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dflash_gguf.progress import Progress

from .client import Completion
from .launch import CTX_SIZE, Launch
from .prompts import Prompt, size_bound
from .speed import generation_speed


@dataclass
class ServerRun:
    """One server's answers to every prompt: in flight together (-np P) and, for speed, one by one."""

    completions: list[Completion]
    sequential: list[Completion]

    def totals(self) -> dict:
        produced = sum(c.n_predicted for c in self.completions)
        drafted = sum(c.draft_n for c in self.completions)
        accepted = sum(c.draft_n_accepted for c in self.completions)
        return {"produced": produced, "drafted": drafted, "accepted": accepted}

    def tokens_per_second(self) -> float:
        return generation_speed(self.sequential)


def measuring_launch(launch: Launch, prompts: Sequence[Prompt], n_predict: int) -> Launch:
    """What measuring adds to the recipe: room in every slot for the longest prompt (a generous
    bound: its bytes) and the new tokens, unless the user's arguments set the context size."""
    if launch.user_value(CTX_SIZE) is not None:
        return launch
    per_slot = max(size_bound(p) for p in prompts) + n_predict + 64
    return launch.adding("-c", str(per_slot * launch.parallel))


def mean_acceptance_length(produced: int, accepted: int, requests: int = 0) -> float:
    """tau: tokens produced per target verification step, the bonus token included (DFlash paper).

    Every step yields its accepted draft tokens plus one token of the target's own, so the number
    of steps is produced - accepted. Each request's first token comes from the prompt's prefill,
    not from a verification step; `requests` leaves those out, as the reference's
    `acceptance_lengths` does."""
    tokens = produced - requests
    steps = tokens - accepted
    return tokens / steps if steps > 0 else 0.0


def acceptance_rate(drafted: int, accepted: int) -> float:
    return accepted / drafted if drafted else 0.0


def first_divergence(speculative: list[int], target: list[int]) -> int | None:
    """Index of the first differing new token (or where one run ends early); None if identical."""
    for i, (a, b) in enumerate(zip(speculative, target)):
        if a != b:
            return i
    return None if len(speculative) == len(target) else min(len(speculative), len(target))
