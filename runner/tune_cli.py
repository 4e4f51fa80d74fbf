"""`dflash-gguf tune`."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from dflash_gguf.progress import printer
from dflash_gguf.hub import resolve as hub
from dflash_gguf.hub.resolve import HubRef
from dflash_gguf.options import (ServerArgsCommand, build_options, draft_option, exact_option, fresh_servers_option, json_option, n_predict_option,
                       prompts_option, rounds_needed, rounds_option, rpc_option, target_option)
from dflash_gguf.settings import Settings, option, refusal, settings_command
from . import tuned_settings as tuned
from .launch import with_rpc
from .prompts import BUILTIN_PROMPTS, read_prompts
from .speed import shown
from .speed_verdict import DEFAULT_MIN_SPEEDUP, speed_verdict
from .tune import TuneResult, TuneSettings, tune

QUICK = {"n_predict": 32, "rounds": 1, "confirm_rounds": 3, "prompts": 6}


def _range(quartiles: list[float] | None) -> str:
    return f"{quartiles[0]:.2f}-{quartiles[1]:.2f}" if quartiles else "-"


def _stopped(row: dict) -> str:
    if row["stalled"]:
        return " (stopped: a request hung)"
    return " (stopped early: far slower)" if row["abandoned"] else ""


def print_table(result: dict, saved: Path | None) -> None:
    click.echo(f"{'setting':<34} {'pairs':>5} {'tok/s':>8} {'alone':>8} {'speedup':>7} {'quartiles':>11} "
               f"{'tau':>5}  stage")
    for r in result["candidates"]:
        if r["error"]:
            click.echo(f"{r['label']:<34} did not start: {r['error'][:100]}")
            continue
        if not r["pairs"]:
            click.echo(f"{r['label']:<34} {0:>5}  no request answered in time: far slower  {', '.join(r['stages'])}")
            continue
        tau = f"{r['tau']:.2f}" if r["tau"] is not None else "-"
        click.echo(f"{r['label']:<34} {r['pairs']:>5} {r['tokens_per_second']:>8.1f} "
                   f"{r['reference_tokens_per_second']:>8.1f} {r['speedup']:>6.2f}x {_range(r['speedup_quartiles']):>11} "
                   f"{tau:>5}  {', '.join(r['stages'])}" + _stopped(r))
    spec, alone, s = result["best_drafting"], result["target_alone"], result["settings"]
    click.echo("")
    click.echo("tok/s: the setting's, median of its passes over the prompts; alone: the target alone's in the "
               "same passes (threads stage: the fastest of a first probe; after it: "
               f"{alone['label']}); speedup: the median over request pairs (each prompt sent to both, one after "
               f"the other) of the ratio; {s['prompts']} prompts x {s['n_predict']} tokens per pass")
    click.echo(f"best drafting setting   {spec['label']}, tau {spec['tau']}")
    if spec["pairs"]:
        click.echo(f"confirmed speedup       {shown(result['confirmation'])}: {spec['tokens_per_second']:.1f} "
                   f"against {alone['tokens_per_second']:.1f} tok/s ({spec['pairs']} fresh request pairs in "
                   f"{spec['runs']} passes" + (", a new pair of servers each" if s.get("fresh_servers") else "")
                   + f"; request pairs' quartiles {_range(spec['speedup_quartiles'])})")
    else:
        click.echo("confirmed speedup       none: no request of the confirmation was answered in time")
    click.echo(f"verdict                 {speed_verdict(result['speedup'], s['min_speedup'], unreliable=result['speedup_unreliable'])}")
    click.echo(f"serve will run          {result['chosen_label']}")
    click.echo(f"llama.cpp               {result['llama']['backend']} build {result['llama']['build']}")
    if saved is not None:
        click.echo(f"saved                   {saved}")


@dataclass(frozen=True, kw_only=True)
class TuneCommandSettings(Settings):
    """`dflash-gguf tune`'s options; `measuring()` is how they measure (runner/tune.py's TuneSettings,
    whose rules are checked with these)."""

    target: Path | HubRef
    draft: Path
    prompts_file: Path | None = option("--prompts")
    n_predict: int | None = None
    rounds: int | None = None
    quick: bool = False
    max_seconds: float | None = None
    min_speedup: float = DEFAULT_MIN_SPEEDUP
    exact: bool = False
    fresh_servers: bool = False
    as_json: bool = option("--json", False)
    backend: str | None = None
    llama_bin: Path | None = None
    rpc: str | None = None
    server_args: tuple[str, ...] = ()

    def problems(self) -> Iterator[str]:
        yield from rounds_needed("tune", self.rounds)
        folded = refusal(with_rpc, self.rpc, self.server_args)
        yield from folded
        # --rpc and the one after -- disagreeing: tune's own rules still read those after --
        yield from refusal(self.measuring, self.server_args if folded else None)

    def measuring(self, server_args: Sequence[str] | None = None) -> TuneSettings:
        """The settings tune measures with: --quick's defaults where the options leave them open, and
        --rpc folded into `server_args` (default: the arguments after `--`)."""
        explore = self.rounds or (QUICK["rounds"] if self.quick else TuneSettings.rounds)
        confirm = QUICK["confirm_rounds"] if self.quick and self.rounds is None else 2 * explore
        return TuneSettings(
            n_predict=self.n_predict or (QUICK["n_predict"] if self.quick else TuneSettings.n_predict),
            rounds=explore, confirm_rounds=confirm,
            min_speedup=self.min_speedup, max_seconds=self.max_seconds, quick=self.quick, backend=self.backend,
            llama_bin=self.llama_bin, exact=self.exact, fresh_servers=self.fresh_servers,
            server_args=list(with_rpc(self.rpc, self.server_args) if server_args is None else server_args))


@click.command("tune", cls=ServerArgsCommand)
@target_option()
@draft_option()
@prompts_option()
@n_predict_option(default=None)
@rounds_option(default=None)
@click.option("--quick", is_flag=True,
              help="A short search: the first 6 prompts, 32 tokens, one pass, coarse draft lengths and one "
                   "p_min.")
@click.option("--max-seconds", type=click.FloatRange(min=0), default=None,
              help="Start no new search stage after this many seconds (the confirmation still runs).")
@click.option("--min-speedup", type=click.FloatRange(min=1.0), default=DEFAULT_MIN_SPEEDUP, show_default=True,
              help="Drafting pays when the confirmed speedup reaches this; below it serve runs the target alone.")
@exact_option
@fresh_servers_option
@json_option
@build_options
@rpc_option
@settings_command(TuneCommandSettings)
def tune_command(settings: TuneCommandSettings) -> None:
    """Find the fastest way to serve TARGET with its drafter on this machine, and whether
    drafting pays at all; `serve` then uses it.

    \b
    Measures, with the patched llama-server started as `serve` starts it (arguments after
    `--` included), the target alone and the drafter across:
      threads         -t 1 .. the CPUs this process may use
      draft length    --spec-draft-n-max, powers of two up to the drafter's trained
                      length (dflash.block_size - 1), then midpoints around the best
      p_min           --spec-draft-p-min 0.2 .. 0.8 at the best length
      controller      --spec-draft-n-max auto (the length chosen per step)
      draft tree      --spec-tree-budget 8, 16, 32 at the trained length (DFlash and
                      DFlash 2 drafters; 16 with --quick)
      tree floor      --spec-tree-p-min 0.1 .. 0.6 with a 16-node budget: no node whose
                      path probability is below it (0.4 with --quick)
    Each setting runs every prompt one at a time (greedy), timed by the server. Timings drift
    on a busy machine, so speeds are only compared side by side: a server of the target alone
    (at its fastest thread count) stays up while each setting's server runs, every prompt goes
    to both, one after the other, and a setting's speedup is the median over these request
    pairs of its tokens/s over the target alone's. A setting far behind after a few pairs, or
    with a request taking 6x the target alone's (and 5 s), is dropped. The best setting is
    then measured again in fresh pairs: that ratio is the reported speedup, and drafting pays
    when it reaches --min-speedup (--fresh-servers: each of its passes on a new pair of servers,
    the target alone's and the setting's). Progress goes to stderr; the table (or --json) to stdout.
    Two servers run at a time (the target's weights are shared when mapped from the file).
    Defaults: -n 64 and --rounds 3 per setting searched, the confirmation twice as many rounds
    (--quick: -n 32, one round, a confirmation of 3).

    \b
    What you fix after `--` is not swept (-t, --spec-draft-n-max, --spec-draft-p-min,
    --spec-tree-budget, --spec-tree-p-min), and
    every other argument there runs in every measurement (e.g. -- -ngl 99 -c 8192).

    \b
    The result is saved in the cache (~/.cache/dflash-gguf/tuned/) for this target file,
    drafter file and llama.cpp build. `serve` with the same three uses it (and says so): the
    tuned threads, draft length, p_min, tree budget and floor, each unless you give your own; when
    drafting does not pay, serve runs the target alone. `serve --no-tuned` ignores it.

    \b
    Examples:
      dflash-gguf tune -t Qwen3-8B-Q4_K_M.gguf -d dflash-Qwen3-8B-F16.gguf
      dflash-gguf tune -t t.gguf -d d.gguf --quick --json -- -ngl 99
    """
    target, draft = hub.local_gguf(settings.target), settings.draft
    prompts = read_prompts(settings.prompts_file) if settings.prompts_file else list(BUILTIN_PROMPTS)
    if settings.quick:
        prompts = prompts[:QUICK["prompts"]]
    measuring = settings.measuring()
    result: TuneResult = tune(target, draft, prompts, measuring, progress=printer())
    report = result.to_dict()
    key = tuned.TuneKey.of(target, draft, result.llama["build"], settings.exact)
    saved = tuned.save(key, report)
    click.echo(f"saved the tuned setting to {saved}", err=True)
    for message in result.warnings:
        click.echo(f"warning: {message}", err=True)
    if settings.as_json:
        click.echo(json.dumps({**report, "saved": str(saved)}, indent=2))
    else:
        print_table(report, saved)


commands = [tune_command]
