"""The target's logits at every position of a speculative output, from one teacher-forced pass.

The target evaluates prompt + output in-process (llama-cpp-python's bindings on the patched
libllama, `runner.engine`), keeping the logits of every position; row i of the result is what the
target predicts for output token i. `compare.check_tokens` then judges each emitted token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from dflash_gguf.runner.bindings import load_model
from . import compare


class TeacherForcing:
    """One target model loaded for teacher-forced passes; use as a context manager."""

    def __init__(self, target: str | Path, n_ctx: int, *, backend: str | None = None, bin_dir: Path | None = None,
                 threads: int | None = None):
        self.target = Path(target)
        self.n_ctx = int(n_ctx)
        self.backend = backend
        self.bin_dir = bin_dir
        self.threads = threads
        self._llm = None

    def __enter__(self) -> "TeacherForcing":

        kwargs = {"n_threads": self.threads} if self.threads else {}
        self._llm = load_model(self.target, backend=self.backend, bin_dir=self.bin_dir, n_ctx=self.n_ctx,
                               logits_all=True, **kwargs)
        return self

    def __exit__(self, *exc_info) -> None:
        if self._llm is not None:
            self._llm.close()
            self._llm = None

    def logits(self, prompt: Sequence[int], output: Sequence[int]) -> np.ndarray:
        """(len(output), n_vocab) float32: row i is the target's logits for output[i]."""
        if self._llm is None:
            raise RuntimeError("TeacherForcing is not open; use it in a `with` block")
        prompt, output = [int(t) for t in prompt], [int(t) for t in output]
        if not prompt:
            raise ValueError("an empty prompt has no position to predict the first token from")
        if len(prompt) + len(output) > self.n_ctx:
            raise ValueError(f"{len(prompt) + len(output)} tokens exceed the context of {self.n_ctx}")
        self._llm.reset()
        self._llm.eval(prompt + output)
        start = len(prompt) - 1
        return np.array(self._llm.scores[start:start + len(output)], dtype=np.float32)

    def check(self, prompt: Sequence[int], output: Sequence[int],
              tolerance: float = compare.DEFAULT_TIE_TOLERANCE) -> list[compare.Finding]:
        """Every token of `output` against the target's argmax (ties and mismatches)."""
        return compare.check_tokens(self.logits(prompt, output), list(output), tolerance)
