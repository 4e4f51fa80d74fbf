"""ValidationReport values for tests of what reads one (release, the exit status), without running
two llama-servers: every field defaulted, the given ones set."""

from __future__ import annotations

from dflash_gguf.validation.validate import PromptResult, ValidationReport


def validation_report(*, exact: bool = True, **fields) -> ValidationReport:
    """A report of one prompt, identical to the target alone's unless `exact` is False."""
    prompt = PromptResult(prompt="p", exact=exact, lossless=True, tokens=1, produced=1, positions_checked=1,
                          proven_by_replay=1, not_proven=[], first_divergence=None if exact else 0, numerical=0,
                          mismatches=0, draft_n=0, draft_n_accepted=0)
    defaults = dict(prompts=[prompt], mean_acceptance_length=1.0, acceptance_rate=0.0, drafted=0, accepted=0,
                    produced=1, proven_by_replay=1, positions_checked=1,
                    tokens_per_second={"target": 1.0, "speculative": 1.0}, speedup=1.0,
                    speed={"speedup": 1.0, "speedup_unreliable": None}, divergences=[], replay={},
                    settings={}, launch={}, llama={}, reference=None, drafting={}, warnings=[], finished_at="")
    return ValidationReport(**{**defaults, **fields})
