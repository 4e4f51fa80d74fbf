"""The prompt sets and model pairs the side-by-side benchmarks (controller, tree) measure, by name.

Sets: `chat` (SmolLM2's held-out chat prompts), `held-out` (the trained pair's), a public suite's
name (`writingbench`, `mt-bench`, ...: validation/suites.py; rows drawn with seed 0), `hex` (strings
of random hexadecimal digits, seed 0: text no drafter predicts; the trained pair's accepts none of
it), a file of benchmarks/prompts/ (`code`, `rewrite`), or two sets joined by `+`, their requests
alternating (`held-out+hex`: a workload whose acceptance changes from request to request, which no
single static length suits). `mixed` is `rewrite+chat`.
"""

from __future__ import annotations

import random
from pathlib import Path

from dflash_gguf.runner.prompts import read_prompts
from dflash_gguf.validation.suites import SUITES, draw_suites
from training.fixtures.smollm2 import EVAL_PROMPTS, smollm2_ggufs

PROMPTS = Path(__file__).parent / "prompts"
TRAINED = Path(__file__).resolve().parents[1] / "build" / "fixtures" / "trained"


def prompt_set(name: str, count: int) -> list:
    """`count` prompts of the set `name` (`A+B`: `count` of each, a shorter set repeated, alternating)."""
    if name == "mixed":
        name = "rewrite+chat"
    if "+" in name:
        first, second = ((prompt_set(part, count) * count)[:count] for part in name.split("+", 1))
        return [p for pair in zip(first, second) for p in pair]
    if name == "hex":
        rng = random.Random(0)
        return [" ".join(f"{rng.getrandbits(32):08x}" for _ in range(40)) for _ in range(count)]
    if name == "chat":
        return read_prompts(EVAL_PROMPTS)[:count]
    if name == "held-out":
        return read_prompts(TRAINED / "prompts.txt")[:count]
    if name in SUITES:
        (drawn,) = draw_suites([name], count, 0)
        return drawn.prompts()
    return read_prompts(PROMPTS / f"{name}.jsonl")[:count]


def pair_files(pair: str) -> dict[str, Path]:
    """The target types' and the drafters' GGUF files by name: `smollm2`, `trained`, or `memory-bound`
    (the trained target widened by inert FFN units to ~457 MiB, benchmarks/regimes.py, made once)."""
    drafters = {"dflash": TRAINED / "dflash.gguf", "dflash2": TRAINED / "dflash2.gguf"}
    if pair == "trained":
        return {"F16": TRAINED / "target.gguf", **drafters}
    if pair == "memory-bound":
        from benchmarks.regimes import memory_bound_target

        return {"F16": memory_bound_target(TRAINED / "target.gguf", TRAINED.parents[1] / "bench" / "memory-bound"),
                **drafters}
    return smollm2_ggufs()
