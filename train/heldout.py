"""A trained drafter's held-out measurement: a greedy `validate` pass in a process of its own.

The process that trained the drafter has run torch's kernels beside libllama's; there, the replay of
the verify batches (libllama in-process) died with SIGILL ("invalid opcode") in libggml-cpu on an
AMX machine (SmolLM2 Q4_K_M, after 1,862 bf16 steps of `train --init`; the same `validate` in a fresh
process passed). A spawned process
that never imports torch loads libllama alone, as `dflash-gguf validate` does.
"""

from __future__ import annotations

import multiprocessing
import sys
from pathlib import Path
from typing import Sequence

from dflash_gguf.runner.prompts import Prompt
from dflash_gguf.validation.validate import ValidationSettings, validate


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _measure(target: Path, draft: Path, prompts: Sequence[Prompt], settings: ValidationSettings) -> dict:
    report = validate(target, draft, prompts, settings, progress=_say)
    return {"tau": report.mean_acceptance_length, "acceptance_rate": report.acceptance_rate,
            "lossless": report.lossless, "exact": report.exact, "prompts": len(prompts),
            "n_predict": settings.n_predict, "speedup": report.speedup,
            "llama": f"{report.llama['backend']} build {report.llama['build']}"}


def measure_apart(target: Path, draft: Path, prompts: Sequence[Prompt], settings: ValidationSettings) -> dict:
    """What the card says about held-out tau, measured in a spawned process."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_measure, (target, draft, list(prompts), settings))
