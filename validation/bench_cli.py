"""`dflash-gguf bench`."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import click

from dflash_gguf.progress import printer
from dflash_gguf.errors import OptionError
from dflash_gguf.hub import resolve as hub
from dflash_gguf.hub.resolve import HubRef
from dflash_gguf.options import (ServerArgsCommand, build_options, draft_option, exact_option, json_option, n_predict_option,
                       prompts_option, rounds_option, fresh_servers_option, seed_option, target_option)
from . import charts as chart
from .acceptance import drafting_lines, limit_line, time_lines
from .bench import ALONE, DEFAULT_LEVELS, DRAFTER, BenchReport, BenchSettings, concurrency_curve, verdict_line
from .suites import DEFAULT_LIMIT, SUITES, draw_suites, markdown, parse_suites, run_suites
from .validate import ValidationSettings
from dflash_gguf.runner.prompts import BUILTIN_PROMPTS, read_prompts
from dflash_gguf.runner.speed import shown
from dflash_gguf.settings import option, refusal, settings_command


def _levels(_ctx, _param, value: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        levels = ()
    if not levels or any(n < 1 or n > 256 for n in levels):
        raise OptionError(f"--concurrency {value!r}: give a comma-separated list of stream counts from 1 to 256, "
                          "e.g. 1,2,4,8")
    return levels


def _suites(_ctx, _param, value: str | None) -> tuple[str, ...]:
    return parse_suites(value) if value is not None else ()


def _speedup(value: float | None) -> str:
    return "--" if value is None else f"{value:.2f}x"


def print_curve(report: BenchReport) -> None:
    """The curve as the published serving tables give it: speedup per concurrency."""
    head = (f"{'streams':>7}  {'aggregate tok/s':>21}  {'per request tok/s':>19}  {'speedup':>7}  "
            f"{'tau':>5}  {'acceptance per slot':<24} identical")
    click.echo(head)
    click.echo(f"{'':>7}  {'alone':>10} {'drafter':>10}  {'alone':>9} {'drafter':>9}")
    for r in report.levels:
        agg, per = r.aggregate_tokens_per_second, r.per_request_tokens_per_second
        slots = " ".join(f"{s['acceptance_rate']:.2f}" for s in r.slots)
        same = "yes" if r.identical else \
            f"NO: {sum(not s['identical'] for s in r.streams)} of {len(r.streams)} streams differ"
        click.echo(f"{r.concurrency:>7}  {agg[ALONE]:>10.1f} {agg[DRAFTER]:>10.1f}  {per[ALONE] or 0:>9.1f} "
                   f"{per[DRAFTER] or 0:>9.1f}  {_speedup(r.speedup):>7}  {r.tau:>5.2f}  {slots:<24} {same}")
        for line in [*drafting_lines(r.drafting), limit_line(r.speed), *time_lines(r.speed)]:
            if line:
                click.echo(f"{'':>9}{line}")
        if not r.target_alone_identical:
            click.echo(f"{'':>9}note: the target alone at -np {r.concurrency} differs from its one-slot "
                       "answers too (the build is not batch-invariant for this model)")
    if not report.identical and not report.settings.get("exact"):
        click.echo("\nA stream that differs is not shown lossless, nor shown wrong: without --exact this build's "
                   "verify batches and multi-slot batches may round differently from one token at one slot. "
                   "Rerun with --exact (batch-invariant kernels: then a difference is the drafter's), or prove "
                   "every token with `dflash-gguf validate -np N`.")
    s = report.settings
    recipe = report.launch["recipe"]
    recipe = ["N" if before == "--parallel" else arg for before, arg in zip(["", *recipe], recipe)]
    click.echo(f"\n{verdict_line(report.levels)}")
    click.echo(f"speedup: median over {s['rounds']} round(s), each the drafter's aggregate over the target "
               f"alone's in the same round; {s['prompts']} prompts x {s['n_predict']} tokens, greedy")
    for r in report.levels:
        if r.speedup is None:
            click.echo(f"  -- at {r.concurrency} stream(s): {shown(r.speed)}")
    click.echo(f"llama.cpp {report.llama['backend']} build {report.llama['build']}; "
               f"serve's launch: {' '.join(recipe)}"
               + (f"; your arguments: {' '.join(report.launch['user_args'])}" if report.launch["user_args"]
                  else ""))


@dataclass(frozen=True, kw_only=True)
class BenchCommandSettings(BenchSettings):
    """`dflash-gguf bench`'s options: the curve's (BenchSettings), or with --suite validate's for each suite
    (`validation()`), and what the command reads and writes."""

    target: Path | HubRef
    draft: Path
    prompts_file: Path | None = option("--prompts")
    suites: tuple[str, ...] = option("--suite", ())
    limit: int = DEFAULT_LIMIT
    seed: int | None = None
    charts_dir: Path | None = option("--charts")
    as_json: bool = option("--json", False)
    explicit: frozenset[str] = frozenset()  # the options given, not defaulted (dflash_gguf/settings.py)

    def problems(self) -> Iterator[str]:
        if self.suites and self.explicit & {"levels", "prompts_file"}:
            yield ("--suite takes its prompts from the suites and runs one stream at a time; leave out "
                   "--concurrency and --prompts (or --suite, for the concurrency curve)")
        if not self.suites:
            if self.explicit & {"limit", "seed"}:
                yield "--limit and --seed choose the rows of --suite; give --suite NAME or leave them out"
            yield from super().problems()
        if self.charts_dir is not None:
            yield from refusal(chart.check, self.charts_dir,
                               chart.SUITE_CHARTS if self.suites else chart.CURVE_CHARTS)

    def validation(self) -> ValidationSettings:
        """How each suite's prompts are validated (--suite)."""
        return ValidationSettings(n_predict=self.n_predict, rounds=self.rounds, fresh_servers=self.fresh_servers,
                                  exact=self.exact, backend=self.backend, llama_bin=self.llama_bin,
                                  server_args=list(self.server_args))


@click.command("bench", cls=ServerArgsCommand)
@target_option()
@draft_option()
@click.option("--concurrency", "levels", default=",".join(map(str, DEFAULT_LEVELS)), show_default=True,
              callback=_levels, help="Concurrent streams to measure, comma-separated; each gets servers "
                                     "with that many slots (-np).")
@prompts_option()
@click.option("--suite", "suites", callback=_suites, metavar="NAME[,NAME]",
              help=f"Instead of the curve: per public benchmark suite ({', '.join(SUITES)}), --limit prompts "
                   "validated as `validate` does (every token proven, tau, acceptance by depth, the "
                   "accepted-length histogram, the speedup from interleaved rounds). Each suite's data is a "
                   "file of a PyPI wheel pinned by sha256 (docs/benchmarks.md names them and their licences).")
@click.option("--limit", type=click.IntRange(1, 10_000), default=DEFAULT_LIMIT, show_default=True,
              help="--suite: prompts drawn per suite (all its rows when it has fewer).")
@seed_option
@click.option("--charts", "charts_dir", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Also draw PNG charts into DIR (made when missing): throughput against streams with and "
                   "without the drafter and acceptance by depth (the curve), or acceptance by depth and the "
                   "accepted-length histogram per suite. Needs the [charts] extra (matplotlib).")
@n_predict_option()
@rounds_option()
@fresh_servers_option
@click.option("--min-round-seconds", type=click.FloatRange(0, 3600), default=2.0, show_default=True,
              help="A round's pass goes over the prompts as many times as make it last at least this long "
                   "(estimated from the one-slot reference's timings): rounds of a fraction of a second, as "
                   "a small target's are (48 tokens in ~30 ms), time the machine's noise, not the servers. "
                   "0: one pass over the prompts.")
@exact_option
@build_options
@json_option
@settings_command(BenchCommandSettings)
def bench_command(settings: BenchCommandSettings) -> None:
    """Throughput against concurrency, with the drafter and without, every stream checked.

    \b
    For each level N of --concurrency, two llama-servers run as `serve` starts them (the
    arguments after `--` included) with -np N: the target alone and the target with its
    drafter. N client streams send their requests at once, each one request at a time,
    first to one server then to the other (the order alternates by round), so every
    speedup is a ratio measured side by side. Reported per level: aggregate tokens/s (all
    streams' tokens over the wall time), per-request tokens/s (the server's own timing),
    the speedup, tau and the acceptance of each server slot (llama.cpp #27117: acceptance
    drops with many slots), and whether every stream is identical: each answer, greedy,
    identical token for token to the target alone's at one slot for the same prompt.
    Then where drafting stops paying, from the numbers.

    \b
    On llama.cpp's CPU build a token's logits depend on the width of its batch (a
    verify batch, or the slots decoding together), so without --exact an answer can
    differ from the one-slot answer at a near-tie while every token is still the
    target's (validate proves that; bench only compares). With --exact the kernels are
    batch-invariant and the comparison is bit-exact.

    \b
    With --suite, public benchmark prompts instead (HumanEval, GSM8K, MT-Bench's first turns,
    WritingBench): --limit rows drawn per suite with --seed, each rendered by the target's
    chat template and validated; a markdown table (or --json) names each suite's wheel
    and the rows drawn.

    \b
    Exit status: 0 when every stream is identical (--suite: every suite lossless), 1 when
    one is not, 2 on bad input (an unknown suite, a wheel missing, altered or malformed).

    \b
    Examples:
      dflash-gguf bench -t Qwen3-8B-Q4_K_M.gguf -d dflash-Qwen3-8B-F16.gguf -- -t 8
      dflash-gguf bench -t t.gguf -d d.gguf --concurrency 1,4,16 --prompts p.txt -n 128 --json -- -ngl 99
      dflash-gguf bench -t t.gguf -d d.gguf --suite humaneval,gsm8k,mt-bench --limit 16 --charts charts/
    """
    target = hub.local_gguf(settings.target)
    if settings.suites:
        _bench_suites(target, settings)
    prompts = read_prompts(settings.prompts_file) if settings.prompts_file else list(BUILTIN_PROMPTS)
    report = concurrency_curve(target, settings.draft, prompts, settings,
                               progress=printer())
    for message in report.warnings:
        click.echo(f"warning: {message}", err=True)
    if settings.charts_dir is not None:
        _charts(chart.curve_charts(report.to_dict(), settings.charts_dir))
    if settings.as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        print_curve(report)
    sys.exit(0 if report.identical else 1)


def _charts(written: list[Path]) -> None:
    for path in written:
        click.echo(f"chart: {path}", err=True)


def _bench_suites(target: Path, settings: BenchCommandSettings) -> None:
    drawn = draw_suites(settings.suites, settings.limit, settings.seed or 0)  # every wheel read before a server starts
    report = run_suites(target, settings.draft, drawn, settings.validation(), settings.limit, settings.seed or 0,
                        progress=printer())
    for message in report.warnings:
        click.echo(f"warning: {message}", err=True)
    if settings.charts_dir is not None:
        _charts(chart.suite_charts(report.to_dict(), settings.charts_dir))
    click.echo(json.dumps(report.to_dict(), indent=2) if settings.as_json else markdown(report))
    sys.exit(0 if report.lossless else 1)


commands = [bench_command]
