"""`dflash-gguf validate --temperature T`: is the speculative run's *distribution* the target's?

The patched llama-server draws `samples` continuations of `positions` tokens for every prompt with
the drafter, then as many without it (or with `baseline` alone), every request with a seed of its
own, and `validation.distribution` tests per prompt and position whether both sets come from one
distribution. Acceptance comes from the speculative requests' `timings`.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from dflash_gguf.runner.build import build_info, find_bin_dir
from dflash_gguf.runner.client import Completion
from dflash_gguf.runner.launch import Launch, launch_recipe
from dflash_gguf.runner.measure import Progress, acceptance_rate, mean_acceptance_length, measuring_launch
from . import distribution
from dflash_gguf.runner.prompts import Prompt, tokenize_prompts
from .validate import ValidationSettings

log = logging.getLogger(__name__)

SEED_LIMIT = 2**32 - 1  # llama.cpp seeds are uint32; 0xFFFFFFFF means "random"


@dataclass
class Sampling:
    """The sampler every request uses, and the size of the test."""

    temperature: float
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    min_p: float = 0.0  # 0.0: off (llama-server's own default is 0.05)
    samples: int = 200  # continuations per prompt, in each set
    positions: int = 8  # tokens per continuation, each one tested
    seed: int = 0
    alpha: float = distribution.DEFAULT_ALPHA

    def seed_for(self, arm: int, prompt: int, sample: int, n_prompts: int) -> int:
        """A distinct seed for every request of both sets (arm 0: with the drafter, 1: without)."""
        per_arm = n_prompts * self.samples
        return ((self.seed * 2 + arm) * per_arm + prompt * self.samples + sample) % SEED_LIMIT

    def request(self) -> dict:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p}


def _sample(launch: Launch, prompts: list[list[int]] | Sequence[Prompt], sampling: Sampling, arm: int, bin_dir: Path,
            label: str, progress: Progress) -> tuple[list[list[Completion]], list[list[int]], list[str]]:
    """`sampling.samples` completions of every prompt from one server, per prompt; the prompts as
    token ids and the server's command line come back too."""
    with launch.server(bin_dir=bin_dir) as server:
        client = server.client
        if prompts and not isinstance(prompts[0], list):
            prompts = tokenize_prompts(client, prompts)
        progress(f"{label}: server up at {client.url}; {sampling.samples} samples of each of {len(prompts)} prompts, "
                 f"{launch.parallel} in flight")
        jobs = [(q, k) for q in range(len(prompts)) for k in range(sampling.samples)]

        def ask(job: tuple[int, int]) -> Completion:
            q, k = job
            return client.complete(prompts[q], sampling.positions, seed=sampling.seed_for(arm, q, k, len(prompts)),
                                   **sampling.request())

        with ThreadPoolExecutor(max_workers=launch.parallel) as pool:
            answers = list(pool.map(ask, jobs))
        command = server.command()
        progress(f"{label}: done")
    per_prompt = [answers[q * sampling.samples:(q + 1) * sampling.samples] for q in range(len(prompts))]
    return per_prompt, prompts, command


@dataclass(frozen=True)
class SampledPrompt:
    """One prompt's samples with the drafter (a row of the report's `prompts`)."""
    prompt: str
    samples: int
    produced: int
    draft_n: int
    draft_n_accepted: int


@dataclass(frozen=True)
class DistributionReport:
    """A validation at temperature > 0; `to_dict()` is the JSON `--json` prints and `--report` writes."""
    distribution: distribution.DistributionTest
    prompts: list[SampledPrompt]
    mean_acceptance_length: float
    acceptance_rate: float
    drafted: int
    accepted: int
    produced: int
    settings: dict
    launch: dict  # serve's recipe, the user's arguments after --, both commands
    llama: dict
    warnings: list[str]
    finished_at: str

    def to_dict(self) -> dict:
        return asdict(self)


def validate_distribution(target: str | Path, draft: str | Path, prompts: Sequence[Prompt], settings: ValidationSettings,
                          sampling: Sampling, baseline: str | Path | None = None,
                          progress: Progress | None = None) -> DistributionReport:
    """Sample both servers and test their distributions."""
    progress = progress or (lambda msg: log.info(msg))
    target, draft = Path(target), Path(draft)
    baseline = Path(baseline) if baseline else target
    launch = measuring_launch(launch_recipe(target, draft, parallel=settings.parallel,
                                            server_args=settings.user_server_args()),
                              prompts, sampling.positions)
    bin_dir = find_bin_dir(settings.backend, settings.llama_bin)
    spec, prompt_ids, spec_command = _sample(launch, list(prompts), sampling, 0, bin_dir, "speculative", progress)
    alone, _, alone_command = _sample(launch.alone(baseline), prompt_ids, sampling, 1, bin_dir, "target alone",
                                      progress)

    test = distribution.compare_samples(
        [distribution.pad([c.tokens for c in answers], sampling.positions) for answers in spec],
        [distribution.pad([c.tokens for c in answers], sampling.positions) for answers in alone], sampling.alpha)
    results = [SampledPrompt(prompt=str(text), samples=len(answers), produced=sum(c.n_predicted for c in answers),
                             draft_n=sum(c.draft_n for c in answers),
                             draft_n_accepted=sum(c.draft_n_accepted for c in answers))
               for text, answers in zip(prompts, spec)]
    produced = sum(r.produced for r in results)
    drafted = sum(r.draft_n for r in results)
    accepted = sum(r.draft_n_accepted for r in results)
    warnings = list(launch.warnings)
    if launch.tree_budget and not any(c.timings.get("draft_tree_budget") for answers in spec for c in answers):
        # patch 0009: the walk down a tree takes the target's greedy tokens, which would bias a sampler
        warnings.append(f"--spec-tree-budget {launch.tree_budget}: llama-server verified these sampled requests with "
                        "the chain (the tree serves greedy requests only), so this run tested the chain's sampling")
    return DistributionReport(
        distribution=test,
        prompts=results,
        mean_acceptance_length=round(mean_acceptance_length(produced, accepted, len(prompts) * sampling.samples), 4),
        acceptance_rate=round(acceptance_rate(drafted, accepted), 4),
        drafted=drafted, accepted=accepted, produced=produced,
        settings={"parallel": launch.parallel, **sampling.request(), "samples": sampling.samples,
                  "positions": sampling.positions, "seed": sampling.seed, "alpha": sampling.alpha,
                  "draft_max": launch.draft_setting, "tree_budget": launch.tree_budget,
                  "tree_p_min": launch.tree_p_min, "baseline": str(baseline)},
        launch={**launch.summary(), "speculative_command": spec_command, "target_command": alone_command},
        llama=build_info(bin_dir, settings.backend),
        warnings=warnings,
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def verdict(report: DistributionReport) -> int:
    """Exit status: 1 when the two sets differ, else 0."""
    return 1 if report.distribution.verdict == distribution.DIFFERENT else 0
