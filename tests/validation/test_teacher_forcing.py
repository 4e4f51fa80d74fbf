"""Every emitted token checked: the target's teacher-forced logits over a real speculative output
find a mismatch that comes after an earlier tie (the old first-divergence check stopped at the tie)."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_gguf.validation.compare import DEFAULT_TIE_TOLERANCE, MISMATCH, TIE
from dflash_gguf.runner.prompts import read_prompts
from dflash_gguf.runner.launch import speculative_args
from dflash_gguf.runner.server import LlamaServer
from dflash_gguf.validation.teacher_forcing import TeacherForcing

pytestmark = pytest.mark.integration

N_NEW = 32
GAP_AFTER_TIE = 6  # the substitution comes this many tokens after the tie


def _top2_gaps(logits: np.ndarray) -> np.ndarray:
    top = np.sort(logits, axis=1)[:, -2:]
    return top[:, 1] - top[:, 0]


def test_a_mismatch_after_a_tie_is_found(trained_pair, llama_bin):
    """A speculative output with a near-tie taken the other way, then, later, a token the target
    ranks last; the continuations after each are the speculative server's own greedy tokens."""
    target = trained_pair["target"]
    with LlamaServer(target, ["-np", "1", "-c", "1024", "--no-warmup"] + speculative_args(trained_pair["dflash"]),
                     bin_dir=llama_bin) as server, TeacherForcing(target, 256, bin_dir=llama_bin) as forced:
        client = server.client

        def continue_greedy(prompt: list[int], prefix: list[int]) -> list[int]:
            rest = N_NEW - len(prefix)
            return prefix + client.complete(prompt + prefix, rest, temperature=0.0, cache_prompt=False).tokens

        for text in read_prompts(trained_pair["prompts"]):
            prompt = client.tokenize(text, add_special=True)
            output = continue_greedy(prompt, [])
            assert forced.check(prompt, output) == [] or all(f.kind == TIE for f in forced.check(prompt, output))
            gaps = _top2_gaps(forced.logits(prompt, output))[: N_NEW - GAP_AFTER_TIE - 2]
            if gaps.min() < DEFAULT_TIE_TOLERANCE / 2:
                break
        else:
            pytest.fail("no held-out prompt has a near-tie in its first tokens")

        # 1. the tie: the target's runner-up where its top two are closest
        tie_at = int(gaps.argmin())
        row = forced.logits(prompt, output)[tie_at]
        runner_up = int(np.argsort(row)[-2])
        output = continue_greedy(prompt, output[:tie_at] + [runner_up])
        # 2. the mismatch, later: the token the target ranks last there
        bad_at = tie_at + GAP_AFTER_TIE
        row = forced.logits(prompt, output)[bad_at]
        output = continue_greedy(prompt, output[:bad_at] + [int(row.argmin())])

        findings = forced.check(prompt, output)
    assert len(output) == N_NEW
    first_tie = findings[0]
    assert (first_tie.position, first_tie.kind, first_tie.speculative_token) == (tie_at, TIE, runner_up)
    assert first_tie.margin == pytest.approx(float(gaps[tie_at]), abs=1e-3)
    mismatches = [f for f in findings if f.kind == MISMATCH]
    assert [f.position for f in mismatches] == [bad_at]
    assert mismatches[0].margin == pytest.approx(float(row.max() - row.min()), rel=1e-3)
