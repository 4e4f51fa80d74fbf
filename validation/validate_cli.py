"""`dflash-gguf validate`."""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import click

from dflash_gguf.progress import printer
from dflash_gguf.hub.model_param import ModelParam
from dflash_gguf.hub import resolve as hub
from dflash_gguf.hub.resolve import HubRef
from dflash_gguf.options import (GGUF, OUTPUT_FILE, ServerArgsCommand, build_options, draft_option, exact_option, json_option,
                       n_predict_option, parallel_option, prompts_option, rounds_option, fresh_servers_option, rpc_option, seed_option, target_option,
                       temperature_option, threads_option)
from dflash_gguf.outputs import Input, Output, Replace, check_outputs, write_text
from dflash_gguf.runner.prompts import BUILTIN_PROMPTS, read_prompts
from dflash_gguf.runner.speed import MIN_ROUNDS, shown
from dflash_gguf.settings import option, refusal, settings_command
from .acceptance import drafting_lines, limit_line, time_lines
from .distribution import DEFAULT_ALPHA
from .validate import ValidationReport, ValidationSettings, is_report, validate, verdict
from .validate_sampled import DistributionReport, Sampling, validate_distribution
from .validate_sampled import verdict as sampled_verdict


def exactness(identical: Sequence[bool]) -> str:
    """The "identical to the target alone" line, from each prompt's verdict (`PromptResult.exact`,
    or a JSON report's `prompts[i]["exact"]`)."""
    same = sum(map(bool, identical))
    return f"{'yes' if same == len(identical) else 'no'}: {same} of {len(identical)} prompts token for token"


def losslessness(report: ValidationReport) -> str:
    """The "lossless" line: every token the target's own choice in the batch that produced it."""
    mismatches = sum(p.mismatches for p in report.prompts)
    checked, produced = report.positions_checked, report.produced
    if mismatches:
        return f"no: {mismatches} token(s) the target did not choose in their batch"
    if checked != produced:
        return f"not proven: {produced - checked} of {produced} tokens could not be checked"
    return f"yes: all {produced} tokens are the target's argmax in the batch that produced them"


def meaning(report: ValidationReport) -> str | None:
    """What a lossless run that is not identical means for the user (None when there is nothing to say)."""
    if report.exact or not report.lossless:
        return None
    numerical = [d for d in report.divergences if d["kind"] == "numerical" and "plain_logits" in d]
    widths = sorted({d["width"] for d in numerical})
    gaps = [abs(d["margin"]) for d in numerical] + [abs(d.get("plain_margin") or 0) for d in numerical]
    return (f"the outputs differ only by batching numerics: at {len(numerical)} near-tie(s) (logit gaps up to "
            f"{max(gaps, default=0):.3f}) the target itself chose differently in a verify batch of "
            f"{'/'.join(map(str, widths))} tokens than one token at a time. No drafted token was taken that "
            "the target did not choose; plain decoding on this build would give the same text only in "
            "batches of one. For token-identical output use --exact (serve --exact).")


def _print_table(report: ValidationReport) -> None:
    click.echo(f"{'#':>2}  {'result':<9} {'tokens':>6} {'drafted':>7} {'accepted':>8}  prompt")
    for i, r in enumerate(report.prompts, 1):
        result = "mismatch" if r.mismatches else "identical" if r.exact else "numerical"
        prompt = r.prompt.replace("\n", "\\n")[:48]
        click.echo(f"{i:>2}  {result:<9} {r.positions_checked:>6} {r.draft_n:>7} "
                   f"{r.draft_n_accepted:>8}  {prompt}")
        for d in report.divergences:
            if d["prompt"] != r.prompt:
                continue
            if d["kind"] == "mismatch":
                click.echo(f"    mismatch at new token {d['position']}: emitted {d['speculative_token']}, the target's "
                           f"argmax in its batch of {d['width']} is {d['target_token']} (logit margin {d['margin']:.4f})")
            elif "plain_logits" in d:
                click.echo(f"    numerical at new token {d['position']}: {d['speculative_token']} chosen in a verify "
                           f"batch of {d['width']} (by {d['margin']:.4f} logits), {d['target_token']} one token at a "
                           f"time (by {d.get('plain_margin') or 0:.4f})")
            else:
                click.echo(f"    numerical at new token {d['position']}: within the measured noise "
                           f"(margin {d['margin']:.4f}, batch of {d['width']})")
        if not r.exact and not any(d["prompt"] == r.prompt and "plain_logits" in d for d in report.divergences):
            click.echo(f"    the target-alone run's tokens differ from new token {r.first_divergence} on")
    tps = report.tokens_per_second
    replay = report.replay
    click.echo("")
    click.echo(f"lossless                {losslessness(report)}")
    click.echo(f"identical to target     {exactness([p.exact for p in report.prompts])}")
    if (text := meaning(report)) is not None:
        click.echo(f"  what it means         {text}")
    click.echo(f"tokens checked          {report.positions_checked} of {report.produced} produced, each against "
               "a replay of its own verify batch")
    click.echo(f"proven by replay        {report.proven_by_replay} of {report.produced} tokens are the target's "
               "argmax in the replay of their own verify batch"
               + (f" ({replay['restores']} checkpoint restores followed)" if replay.get("restores") else ""))
    for i, r in enumerate(report.prompts, 1):
        for miss in r.not_proven[:3]:
            click.echo(f"  prompt {i}, new token {miss['position']} ({miss['token']}): {miss['why']}")
        if len(r.not_proven) > 3:
            click.echo(f"  prompt {i}: {len(r.not_proven) - 3} more not proven (see the JSON report)")
    if replay["exact"]:
        click.echo(f"replay                  exact: reproduced all {replay['alone_tokens']} tokens of the target-alone run")
    else:
        click.echo(f"replay                  reproduced {replay['alone_tokens_reproduced']} of {replay['alone_tokens']} "
                   f"target-alone tokens; tolerance {replay['tolerance']:.4f} from the measured batching noise")
    if report.settings.get("exact"):
        click.echo("exact mode              on (batch-invariant verification)")
    click.echo(f"mean acceptance length  {report.mean_acceptance_length:.3f} tokens per target step (tau)")
    if report.reference:
        click.echo(f"  reference (PyTorch)   {report.reference['mean_acceptance_length']:.3f}")
        parity = report.reference["draft_parity"]
        if parity["steps"]:
            click.echo(f"draft parity            first token {parity['first_position_equal']:.1%}, whole block "
                       f"{parity['block_equal']:.1%} of {parity['steps']} steps equal the reference's; "
                       f"{parity['systematic']} of {parity['differing_steps']} differing steps beyond the "
                       f"F16-vs-F32 noise ({parity['noise_f16_vs_f32']:.4f})")
            if (d := parity["first_differing_step"]) is not None:
                click.echo(f"  first difference      prompt {d['prompt'] + 1}, position {d['position']}, draft token "
                           f"{d['first_difference']}: llama.cpp {d['llama'][d['first_difference']]}, reference "
                           f"{d['reference'][d['first_difference']]} (reference margin {d['reference_margin']:.4f}, "
                           f"{d['verdict']})")
    click.echo(f"acceptance rate         {report.acceptance_rate:.3f} ({report.accepted} / {report.drafted})")
    for line in drafting_lines(report.drafting):
        click.echo(line)
    click.echo(f"tokens/s target alone   {tps['target']:.1f} (median round)")
    click.echo(f"tokens/s speculative    {tps['speculative']:.1f} (median round)")
    click.echo(f"speedup                 {shown(report.speed)}")
    for line in [limit_line(report.speed), *time_lines(report.speed)]:
        if line:
            click.echo(f"                        {line}")
    click.echo(f"llama.cpp               {report.llama['backend']} build {report.llama['build']}")
    launch = report.launch
    click.echo(f"llama-server            serve's launch: {' '.join(launch['recipe'])}")
    if launch["user_args"]:
        click.echo(f"  your arguments        {' '.join(launch['user_args'])}")
    if launch["added"]:
        click.echo(f"  added for checking    {' '.join(launch['added'])} (room in every slot for the prompts; "
                   "the debug log of the server's steps)")


def _print_distribution(report: DistributionReport) -> None:
    d, prompts = report.distribution, report.prompts
    relation = "<" if d.verdict == "different" else ">="
    click.echo(f"distribution            {d.verdict} (p = {d.p_value:.3g} {relation} alpha {d.alpha:g}; "
               f"{d.tests} prompt x position tests, {d.samples} samples per set)")
    for t in d.differing[:10]:
        prompt = prompts[t.prompt].prompt.replace("\n", "\\n")[:40]
        click.echo(f"  differs at new token {t.position} of prompt {t.prompt + 1} (p = {t.p_value:.3g}): {prompt}")
    click.echo(f"mean acceptance length  {report.mean_acceptance_length:.3f} tokens per target step (tau)")
    click.echo(f"acceptance rate         {report.acceptance_rate:.3f} ({report.accepted} / {report.drafted})")
    click.echo(f"llama.cpp               {report.llama['backend']} build {report.llama['build']}")


SAMPLING = tuple(f.name for f in dataclasses.fields(Sampling) if f.name != "temperature")  # --top-k ... --alpha


@dataclass(frozen=True, kw_only=True)
class ValidateSettings(ValidationSettings):
    """`dflash-gguf validate`'s options: how validate runs (ValidationSettings, which the library takes),
    what the command reads and writes, and the sampler of a run above temperature 0 (`SAMPLING`)."""

    target: Path | HubRef
    draft: Path
    prompts_file: Path | None = option("--prompts")
    baseline: Path | None = None
    report_file: Path | None = option("--report")
    as_json: bool = option("--json", False)
    strict: bool = False
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    samples: int | None = None
    positions: int | None = None
    seed: int | None = None
    alpha: float | None = None

    def problems(self) -> Iterator[str]:
        if self.temperature == 0:
            for flag in self.given(*SAMPLING):
                yield (f"{flag}: a sampling option; give --temperature above 0 with it (greedy runs are checked "
                       "token by token)")
        else:
            for flag in self.given("strict", "reference_draft", "reference_target"):
                yield f"{flag}: applies to greedy runs; leave it out with --temperature above 0"
        yield from super().problems()
        yield from refusal(check_outputs, [Output(self.report_file, "--report", Replace.OWNED, owned=is_report,
                                                  what="report")] if self.report_file is not None else [],
                           [Input(self.target, "--target"), Input(self.draft, "--draft"),
                            Input(self.prompts_file, "--prompts"), Input(self.baseline, "--baseline"),
                            Input(self.reference_draft, "--reference-draft"),
                            Input(self.reference_target, "--reference-target")])

    def sampling(self) -> Sampling:
        """The sampler: the options given, the rest Sampling's defaults."""
        given = {name: getattr(self, name) for name in SAMPLING if getattr(self, name) is not None}
        return Sampling(temperature=self.temperature, **given)


@click.command("validate", cls=ServerArgsCommand)
@target_option()
@draft_option()
@prompts_option()
@n_predict_option()
@parallel_option
@temperature_option
@click.option("--top-k", type=click.IntRange(0), help="With --temperature: top-k sampling (default 0, off).")
@click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True),
              help="With --temperature: top-p sampling (default 1.0, off).")
@click.option("--min-p", type=click.FloatRange(0.0, 1.0), help="With --temperature: min-p sampling (default 0.0, off).")
@click.option("--samples", type=click.IntRange(10), help="With --temperature: continuations per prompt with and "
              f"without the drafter (default {Sampling.samples}).")
@click.option("--positions", type=click.IntRange(1, 256), help="With --temperature: tokens per continuation, each "
              f"position tested (default {Sampling.positions}).")
@seed_option
@click.option("--alpha", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True),
              help=f"With --temperature: significance level of the test (default {DEFAULT_ALPHA}).")
@rounds_option(MIN_ROUNDS)
@fresh_servers_option
@click.option("--speed-prompts", type=click.IntRange(1),
              help="The speed rounds send only the first N prompts (default: all); the proof covers all.")
@click.option("--strict", is_flag=True, help="Fail unless the output is also identical to the target alone.")
@exact_option
@click.option("--baseline", type=GGUF,
              help="Compare against this model alone instead of TARGET (e.g. an F16 copy of a quantized target).")
@build_options
@threads_option
@rpc_option
@click.option("--reference-draft", type=ModelParam(file_ok=False, hub_gguf_ok=False),
              help="The drafter's HF checkpoint (a folder, or on the Hub owner/name[@revision]): also run the "
                   "z-lab PyTorch reference, report its tau, and compare every block llama.cpp drafted with the "
                   "reference's at the same context (draft parity).")
@click.option("--reference-target", type=ModelParam(file_ok=False, hub_gguf_ok=False),
              help="The target's HF folder with weights (or on the Hub owner/name[@revision]), for "
                   "--reference-draft.")
@json_option
@click.option("--report", "report_file", type=OUTPUT_FILE,
              help="Also write the full report as JSON to this file.")
@settings_command(ValidateSettings)
def validate_command(settings: ValidateSettings) -> None:
    """Prove a drafter is lossless in llama.cpp, and measure what it buys.

    Runs the patched llama-server on the same prompts (as token ids) with the drafter and without
    it, greedy, N new tokens each, P requests in flight, and answers two questions apart:

    \b
    lossless   every token the speculative run emitted is the target's own choice in the
               batch that produced it. The server logs its steps (-lv 5); the target alone,
               in-process on the same build and with the server's context, evaluates the
               same batches again (same tokens, positions, widths and cache), and each
               emitted token must be the argmax of its row. One that is not is a `mismatch`.
    identical  the tokens equal the target-alone run's. On llama.cpp's CPU build a token's
               logits depend on the width of its batch, so a lossless run can differ at a
               near-tie: that first difference is reported as `numerical`, with both
               tokens' logits in the verify batch and one token at a time, the margins and
               the batch width. --exact removes the cause.

    The replay is checked on the target-alone run too: it must reproduce every one of its
    tokens. If it does not (a server flag it does not mirror), a margin up to the batching
    noise measured in the same run counts as numerical, and the report says so (`replay`).

    The servers are started as `serve` starts them, with the arguments after `--` (your
    deployment: e.g. -- -ctkd q8_0 -fa on -np 8); validate adds a context size that fits
    the prompts in every slot, when none is given, and -lv 5, and the report says what it
    added. With -np above 1 the replay proves the one-at-a-time pass; the in-flight outputs
    count as checked where they equal it.

    Also reports the mean acceptance length tau (tokens per target verification step, bonus
    included, prefill tokens left out), the acceptance rate (accepted / drafted), and the speed:
    the target alone and the speculative server, up together without the debug log, answer
    every prompt in --rounds interleaved rounds (one request at a time, which server goes
    first alternating); the speedup is the median of the rounds' ratios, with their range. A
    ratio the run cannot support (a round above tau, which no drafter can beat; a range wider
    than the median's distance from 1x; fewer than 3 rounds) is printed as "not measured
    reliably here: <why>", with the load average when the machine is oversubscribed, and the
    JSON has `speedup: null` and `speedup_unreliable`.

    Exit status: 0 when lossless and every token checked (--strict: and identical), 1
    otherwise, 2 on bad input.

    With --temperature T > 0 speculative decoding promises the target's distribution, not its
    tokens, and validate tests that instead: every prompt gets --samples continuations of
    --positions tokens with the drafter and as many without (each request its own seed, counting
    up from --seed, default 0; the same T, top-k, top-p and min-p). At each position of each prompt, Pearson's chi-square test of
    homogeneity compares the token counts of the two sets (tokens seen fewer than 10 times there
    pooled into one class, so every expected count is at least 5; a position where every
    continuation has the same token is not tested); Holm's correction over all those tests keeps
    the chance of any false alarm at or below --alpha. The report's `distribution` gives the
    test, samples, positions, the smallest corrected p-value and the verdict, "same" or
    "different", with the positions that differ. Exit 1 on "different".

    \b
    Examples:
      dflash-gguf validate -t Qwen3-8B-Q4_K_M.gguf -d dflash-Qwen3-8B-F16.gguf
      dflash-gguf validate -t Qwen3-8B-Q4_K_M.gguf -d dflash-Qwen3-8B-F16.gguf --prompts mine.txt -n 256 --json
      dflash-gguf validate -t Qwen3-8B-Q4_K_M.gguf -d dflash-Qwen3-8B-F16.gguf -- -ctkd q8_0 -fa on -np 8
      dflash-gguf validate -t Qwen3-8B-Q4_K_M.gguf -d dflash-Qwen3-8B-F16.gguf --temperature 0.7 --samples 200
    """
    target = hub.local_gguf(settings.target)
    prompts = read_prompts(settings.prompts_file) if settings.prompts_file else list(BUILTIN_PROMPTS)
    if settings.temperature == 0:
        report = validate(target, settings.draft, prompts, settings, settings.baseline,
                          progress=printer())
        _write(report.to_dict(), settings.as_json, settings.report_file, lambda _: _print_table(report))
        sys.exit(verdict(report, settings.strict))
    report = validate_distribution(target, settings.draft, prompts, settings, settings.sampling(), settings.baseline,
                                   progress=printer())
    _write(report.to_dict(), settings.as_json, settings.report_file, lambda _: _print_distribution(report))
    sys.exit(sampled_verdict(report))


def _write(report: dict, as_json: bool, report_file: Path | None, print_summary) -> None:
    for message in report["warnings"]:
        click.echo(f"warning: {message}", err=True)
    if report_file is not None:
        write_text(report_file, json.dumps(report, indent=2))
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        print_summary(report)

commands = [validate_command]
