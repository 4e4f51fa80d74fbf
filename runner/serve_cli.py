"""`dflash-gguf serve` and `dflash-gguf generate`: a target + DFlash drafter behind llama-server."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import click

from dflash_gguf.errors import OptionError, ServerError
from dflash_gguf.hub import resolve as hub
from dflash_gguf.hub.resolve import HubRef
from dflash_gguf.options import (
    ServerArgsCommand,
    ServerSettings,
    build_options,
    draft_option,
    exact_option,
    json_option,
    n_predict_option,
    seed_option,
    server_options,
    target_option,
    temperature_option,
)
from dflash_gguf.outputs import Input, Output, Replace, check_outputs
from dflash_gguf.settings import option, refusal, settings_command
from . import tuned_settings as tuned
from .build import build_info, find_bin_dir
from .client import Completion, LlamaClient, Metrics, is_server_url
from .launch import Launch, launch_recipe, parse_server_args, with_rpc
from .pairing import find_drafter
from .server import LlamaServer, stop_on_signals
from .server_log import is_server_log


def _start(settings: ServerSettings, target: Path | HubRef, draft: Path | None, *, use_tuned: bool = False,
           request_timeout: float | None = 600.0, exact: bool = False) -> tuple[Launch, LlamaServer]:
    """The launch recipe for the pair under `settings` (their --rpc folded into the arguments after `--`;
    checked first, its warnings printed once) and its server. `use_tuned`: under the setting `tune`
    saved for the pair and build, if any (the launch may then be the target alone)."""
    s = settings
    target = hub.local_gguf(target)
    server_args = with_rpc(s.rpc, s.server_args)
    if s.log_path is not None:
        check_outputs([Output(s.log_path, "--log", Replace.OWNED, owned=is_server_log, what="llama-server log")],
                      [Input(target, "--target")] + ([Input(draft, "--draft")] if draft is not None else []))
    launch = launch_recipe(target, draft, parallel=s.parallel, draft_max=s.draft_max, host=s.host, port=s.port,
                           server_args=server_args, exact=exact)
    bin_dir = find_bin_dir(s.backend, s.llama_bin)
    applied = _tuned(tuned.TuneKey.of(target, draft, build_info(bin_dir, s.backend)["build"], exact), target,
                     s.draft_max, server_args) if use_tuned and draft is not None else None
    if applied is not None:
        launch = launch_recipe(target, draft if applied.drafting else None, parallel=s.parallel,
                               draft_max=applied.draft_max, host=s.host, port=s.port, server_args=applied.server_args,
                               exact=exact)
    for warning in launch.warnings:
        click.echo(f"warning: {warning}", err=True)
    server = launch.server(bin_dir=bin_dir, log_path=s.log_path, startup_timeout=s.startup_timeout,
                           request_timeout=request_timeout)
    return launch, server


def _tuned(key: tuned.TuneKey, target: Path, draft_max: int | None,
           server_args: tuple[str, ...]) -> tuned.TunedServe | None:
    """The setting `tune` saved under `key` (this target, drafter, build and --exact), applied under
    the user's own choices (and said on stderr); None when there is none."""
    try:
        record = tuned.load(key)
    except tuned.UnreadableTuning as err:
        click.echo(f"warning: ignoring the tuned setting {err}; run `dflash-gguf tune` again or remove the file",
                   err=True)
        return None
    if record is None:
        return None
    applied = tuned.apply(record, draft_max, server_args)
    click.echo(tuned.announce(record, applied, key.path(), target.name), err=True)
    return applied


def _server_args_problems(settings: ServerSettings) -> list[str]:
    """What the runner refuses in the arguments after `--` and in --rpc beside them, before any file is read
    (with_rpc reads those arguments too: what it would refuse about them is said once)."""
    return (refusal(parse_server_args, settings.server_args)
            or refusal(with_rpc, settings.rpc, settings.server_args))


@dataclass(frozen=True, kw_only=True)
class ServeSettings(ServerSettings):
    """`dflash-gguf serve`'s options: the pair (or the target alone) and how to start it (ServerSettings)."""

    target: Path | HubRef
    draft: Path | None = None
    no_draft: bool = False
    no_tuned: bool = False
    exact: bool = False

    def problems(self) -> Iterator[str]:
        if self.no_draft and self.draft is not None:
            yield "serve: --no-draft serves the target alone; give it or --draft, not both"
        yield from _server_args_problems(self)


@click.command("serve", cls=ServerArgsCommand)
@target_option()
@draft_option(required=False)  # left out: the drafter is looked for (runner/pairing.py)
@click.option("--no-draft", is_flag=True, help="Serve the target alone: no drafter, none looked for.")
@build_options
@server_options
@click.option("--no-tuned", is_flag=True,
              help="Ignore the setting `dflash-gguf tune` saved for this target, drafter and build.")
@exact_option
@settings_command(ServeSettings)
def serve(settings: ServeSettings) -> None:
    """Run llama-server with TARGET and its DFlash drafter until Ctrl-C or SIGTERM.

    \b
    Without --draft, serve looks for the drafter itself, in this order: `dflash-*.gguf` and
    `dspark-*.gguf` beside the target (the one of the target's quant first); for a target
    in the Hugging Face cache (a Hub repo id, fetched), the cached sidecar files of its
    repository; then drafter GGUFs in the Hugging Face cache whose name names the
    target's model (dflash-<Model>-<QUANT>.gguf). Nothing is downloaded for the search.
    Each is checked as --draft is; the first that fits is used, and stderr says which,
    and why each other one was skipped (one line each). When none fits, the target is
    served ALONE and stderr says so: a drafter that fails the check is never used.
    --no-draft serves the target alone without looking.

    \b
    The pair is checked first with the converter's rules (hidden size, target layers,
    vocabulary, mask token): a drafter made for another target is refused with one
    line and exit status 2 before anything starts. The launch is the one every command
    runs (validate certifies it): the drafter's flags from its metadata (-md,
    --spec-type, --spec-draft-n-max), --metrics and --parallel, then the arguments after
    `--`, as they are, last, so they override ours. Of those, --port, --host, -np and
    --spec-draft-n-max are read by the runner too (it polls that port); -m, -md and
    --spec-type are refused (use --target, --draft). The server's URL is printed on
    stdout once the models are loaded; the server is stopped when this command ends,
    however it ends.

    \b
    When `dflash-gguf tune` has measured this target, drafter and llama.cpp build, with
    --exact as this serve has it or not, serve uses its result (and says so on stderr): the
    tuned -t, --spec-draft-n-max and --spec-draft-p-min, each unless you give your own
    (--draft-max, or after `--`). When no drafting setting reached tune's --min-speedup,
    serve runs the target WITHOUT the drafter rather than slower. --no-tuned ignores the
    tuning.

    \b
    Examples:
      dflash-gguf serve --target Qwen3-8B-Q4_K_M.gguf --draft dflash-Qwen3-8B-F16.gguf
      dflash-gguf serve --target Qwen3-8B-Q4_K_M.gguf     # the drafter beside it, if one fits
      dflash-gguf serve -t t.gguf -d d.gguf --port 8080 -- -c 8192 -ngl 99
      dflash-gguf serve -t t.gguf -d d.gguf --rpc 10.0.0.2:50052,10.0.0.3:50052 -- -devd none
    """
    target, draft = hub.local_gguf(settings.target), settings.draft
    if draft is None and not settings.no_draft:
        pairing = find_drafter(target)
        for line in pairing.lines():
            click.echo(line, err=True)
        draft = pairing.chosen.path if pairing.chosen is not None else None
    launch, server = _start(settings, target, draft, use_tuned=not settings.no_tuned, exact=settings.exact)
    click.echo(f"starting llama-server ({server.exe}) ...", err=True)
    try:
        with stop_on_signals(), server:
            click.echo(server.client.url)
            sys.stdout.flush()
            how = (f"drafting with {draft.name}" if launch.draft else "the target alone" if draft is None
                   else f"the target alone, {draft.name} not loaded")
            click.echo(f"llama-server pid {server.pid} ready, {how}; log {server.log_path}. Ctrl-C stops it.",
                       err=True)
            rc = server.wait()
            raise ServerError(f"llama-server exited by itself with status {rc} (log: {server.log_path})")
    except KeyboardInterrupt as stop:
        click.echo(f"stopped llama-server ({stop or 'SIGINT'})", err=True)


def _checked_url(url: str) -> str:
    """An http(s) URL with a host (and a valid port), or one line saying what is wrong."""
    if not is_server_url(url):
        raise OptionError(f"--url {url!r}: give a running llama-server's address, e.g. http://127.0.0.1:8080")
    return url


def _result(prompt: str, c: Completion) -> dict:
    return {
        "prompt": prompt,
        "content": c.content,
        "tokens": c.tokens,
        "n_prompt": c.n_prompt,
        "n_predicted": c.n_predicted,
        "stop_type": c.stop_type,
        "draft_n": c.draft_n,
        "draft_n_accepted": c.draft_n_accepted,
        "acceptance": c.acceptance,
        "tokens_per_second": c.tokens_per_second,
    }


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


@dataclass(frozen=True, kw_only=True)
class GenerateSettings(ServerSettings):
    """`dflash-gguf generate`'s options: a running server's --url, or the pair to start one (ServerSettings)."""

    prompts: tuple[str, ...]
    url: str | None = None
    target: Path | HubRef | None = None
    draft: Path | None = None
    n_predict: int
    temperature: float
    seed: int | None = None
    request_timeout: float = option("--timeout")
    as_json: bool = option("--json", False)

    def problems(self) -> Iterator[str]:
        if self.url is not None and (self.target is not None or self.draft is not None or self.server_args
                                     or self.rpc):
            yield ("generate: give either --url of a running server, or --target and --draft (and llama-server "
                   "arguments after --) to start one, not both")
        if self.url is None and (self.target is None or self.draft is None):
            yield "generate: give --url of a running server, or --target and --draft to start one"
        yield from _server_args_problems(self)


@click.command("generate", cls=ServerArgsCommand)
@click.argument("prompts", nargs=-1, required=True, metavar="PROMPT...")
@click.option("--url", default=None, help="A running llama-server (e.g. from `dflash-gguf serve`).")
@target_option(required=False)
@draft_option(required=False)
@n_predict_option()
@temperature_option
@seed_option
@click.option("--timeout", "request_timeout", type=click.FloatRange(min=0.1), default=600.0, show_default=True,
              help="Seconds to wait for each answer (and for a --url server to respond at all).")
@json_option
@build_options
@server_options
@settings_command(GenerateSettings)
def generate(settings: GenerateSettings) -> None:
    """Complete each PROMPT and report how many drafted tokens the target accepted.

    \b
    Either --url of a running server, or --target and --draft to start one (checked
    and launched as `serve` does, arguments after `--` included) for the duration of
    the command. The text goes to stdout; per-prompt acceptance
    (timings.draft_n_accepted / draft_n of each answer) and the server's counters over
    the run (/metrics) go to stderr, or everything into one object with --json.

    \b
    Examples:
      dflash-gguf generate -t t.gguf -d d.gguf "The capital of France is" -n 32 -- -c 4096
      dflash-gguf generate --url http://127.0.0.1:8080 --json "Hello" "Write a haiku"
    """
    def run(client: LlamaClient) -> dict:
        before = _metrics(client)
        results = []
        for prompt in settings.prompts:
            c = client.complete(prompt, settings.n_predict, temperature=settings.temperature, seed=settings.seed)
            results.append(_result(prompt, c))
            if not settings.as_json:
                click.echo(c.content)
                click.echo(f"[{c.n_predicted} tokens, drafted {c.draft_n}, accepted {c.draft_n_accepted} "
                           f"({_pct(c.acceptance)})" + (f", {c.tokens_per_second:.1f} tok/s]"
                                                        if c.tokens_per_second else "]"), err=True)
        after = _metrics(client)
        run_metrics = after.since(before).summary() if after is not None and before is not None else None
        return {"url": client.url, "results": results, "metrics": run_metrics}

    if settings.url is not None:
        report = run(LlamaClient(_checked_url(settings.url), timeout=settings.request_timeout))
        report["server"] = None
    else:
        _, server = _start(settings, settings.target, settings.draft, request_timeout=settings.request_timeout)
        with stop_on_signals(), server:
            report = run(server.client)
            report["server"] = {"target": str(settings.target), "draft": str(settings.draft), "args": server.args}
    drafted = sum(r["draft_n"] for r in report["results"])
    accepted = sum(r["draft_n_accepted"] for r in report["results"])
    report["draft_n"], report["draft_n_accepted"] = drafted, accepted
    report["acceptance"] = accepted / drafted if drafted else None
    if settings.as_json:
        click.echo(json.dumps(report, indent=2, ensure_ascii=False))
        return
    m = report["metrics"]
    line = f"total: drafted {drafted}, accepted {accepted} ({_pct(report['acceptance'])})"
    if m is not None and m["drafts"]:
        line += f"; {m['drafts']} drafts, mean accepted length {m['mean_accepted_length']:.2f} tokens/step"
    click.echo(line, err=True)


def _metrics(client: LlamaClient) -> Metrics | None:
    """/metrics, or None when the server runs without --metrics."""
    try:
        return client.metrics()
    except ServerError:
        return None


commands = [serve, generate]
