"""`dflash-gguf serve` and `dflash-gguf generate`: a target + DFlash drafter behind llama-server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from . import build as _build
from .server import (
    STARTUP_TIMEOUT,
    Completion,
    LlamaClient,
    Metrics,
    ServerError,
    dflash_server,
    stop_on_signals,
)

_gguf = click.Path(exists=True, dir_okay=False, path_type=Path)


def _server_options(f):
    """Options shared by the commands that start a server."""
    for option in reversed([
        click.option("--backend", type=click.Choice(_build.BACKENDS), default=None,
                     help="Which patched llama.cpp build to run (see `dflash-gguf llama build`). "
                          "Default: metal on macOS, cuda when a CUDA toolkit is found, else cpu."),
        click.option("--port", type=click.IntRange(0, 65535), default=None,
                     help="Port to listen on. Default: a free port."),
        click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on."),
        click.option("--parallel", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Server slots (requests decoded together). DFlash acceptance drops with "
                          "many slots (llama.cpp #27117), hence one by default."),
        click.option("--draft-max", type=click.IntRange(min=1), default=None,
                     help="Longest draft. Default: what the drafter was trained for "
                          "(dflash.block_size - 1; a whole block for DSpark)."),
        click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Keep llama-server's log in this file. Default: a temporary file, "
                          "removed after a clean stop."),
        click.option("--startup-timeout", type=click.FloatRange(min=1), default=STARTUP_TIMEOUT,
                     show_default=True, help="Seconds to wait for the models to load."),
    ]):
        f = option(f)
    return f


@click.command("serve", context_settings={"ignore_unknown_options": True})
@click.option("--target", "-m", required=True, type=_gguf, help="The target model GGUF.")
@click.option("--draft", "-d", required=True, type=_gguf, help="The DFlash drafter GGUF made for that target.")
@_server_options
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- LLAMA_SERVER_ARGS...]")
def serve(target: Path, draft: Path, backend: str | None, port: int | None, host: str, parallel: int,
          draft_max: int | None, log_path: Path | None, startup_timeout: float,
          server_args: tuple[str, ...]) -> None:
    """Run llama-server with TARGET and its DFlash drafter until Ctrl-C or SIGTERM.

    \b
    The pair is checked first with the converter's rules (hidden size, target layers,
    vocabulary, mask token): a drafter made for another target is refused with one
    line and exit status 2 before anything starts. The speculative flags come from
    the drafter's metadata (-md, --spec-type draft-dflash, --spec-draft-n-max), and
    /metrics is on. Arguments after `--` go to llama-server as they are, last, so they
    override ours. The server's URL is printed on stdout once the models are loaded;
    the server is stopped when this command ends, however it ends.

    \b
    Examples:
      dflash-gguf serve --target Qwen3-8B-Q4_K_M.gguf --draft dflash-Qwen3-8B-F16.gguf
      dflash-gguf serve -m t.gguf -d d.gguf --port 8080 -- -c 8192 -ngl 99
    """
    extra = list(server_args)
    server = dflash_server(target, draft, parallel=parallel, extra_args=extra, draft_max=draft_max,
                           backend=backend, host=host, port=port, log_path=log_path,
                           startup_timeout=startup_timeout)
    click.echo(f"starting llama-server ({server.exe}) ...", err=True)
    try:
        with stop_on_signals(), server:
            click.echo(server.url)
            sys.stdout.flush()
            click.echo(f"llama-server pid {server.pid} ready, drafting with {draft.name}; "
                       f"log {server.log_path}. Ctrl-C stops it.", err=True)
            rc = server.wait()
            raise ServerError(f"llama-server exited by itself with status {rc} (log: {server.log_path})")
    except KeyboardInterrupt as stop:
        click.echo(f"stopped llama-server ({stop or 'SIGINT'})", err=True)


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


@click.command("generate")
@click.argument("prompts", nargs=-1, required=True, metavar="PROMPT...")
@click.option("--url", default=None, help="A running llama-server (e.g. from `dflash-gguf serve`).")
@click.option("--target", "-m", type=_gguf, default=None, help="Start a server with this target for the run...")
@click.option("--draft", "-d", type=_gguf, default=None, help="...and this DFlash drafter.")
@click.option("-n", "--n-predict", type=click.IntRange(min=1), default=64, show_default=True,
              help="Tokens to generate per prompt.")
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="0 is greedy. Above 0 the target's sampler still decides (the output keeps "
                   "the target's distribution); the drafter drafts greedily.")
@click.option("--seed", type=int, default=None, help="Sampling seed (with --temperature > 0).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: every answer and the acceptance.")
@_server_options
@click.option("--server-arg", "server_args", multiple=True, metavar="ARG",
              help="One more llama-server argument for the server this command starts (repeat it: "
                   "--server-arg=-c --server-arg=8192).")
def generate(prompts: tuple[str, ...], url: str | None, target: Path | None, draft: Path | None,
             n_predict: int, temperature: float, seed: int | None, as_json: bool, backend: str | None,
             port: int | None, host: str, parallel: int, draft_max: int | None, log_path: Path | None,
             startup_timeout: float, server_args: tuple[str, ...]) -> None:
    """Complete each PROMPT and report how many drafted tokens the target accepted.

    \b
    Either --url of a running server, or --target and --draft to start one (checked
    and set up as `serve` does) for the duration of the command. The text goes to
    stdout; per-prompt acceptance (timings.draft_n_accepted / draft_n of each answer)
    and the server's counters over the run (/metrics) go to stderr, or everything
    into one object with --json.

    \b
    Examples:
      dflash-gguf generate -m t.gguf -d d.gguf "The capital of France is" -n 32
      dflash-gguf generate --url http://127.0.0.1:8080 --json "Hello" "Write a haiku"
    """
    if url is not None and (target is not None or draft is not None):
        raise click.UsageError("give either --url or --target with --draft, not both")
    if url is None and (target is None or draft is None):
        raise click.UsageError("give --url of a running server, or --target and --draft to start one")

    def run(client: LlamaClient) -> dict:
        before = _metrics(client)
        results = []
        for prompt in prompts:
            c = client.complete(prompt, n_predict, temperature=temperature, seed=seed)
            results.append(_result(prompt, c))
            if not as_json:
                click.echo(c.content)
                click.echo(f"[{c.n_predicted} tokens, drafted {c.draft_n}, accepted {c.draft_n_accepted} "
                           f"({_pct(c.acceptance)})" + (f", {c.tokens_per_second:.1f} tok/s]"
                                                        if c.tokens_per_second else "]"), err=True)
        after = _metrics(client)
        run_metrics = after.since(before).summary() if after is not None and before is not None else None
        return {"url": client.url, "results": results, "metrics": run_metrics}

    if url is not None:
        report = run(LlamaClient(url))
        report["server"] = None
    else:
        server = dflash_server(target, draft, parallel=parallel, draft_max=draft_max, extra_args=server_args,
                               backend=backend, host=host, port=port, log_path=log_path,
                               startup_timeout=startup_timeout)
        with stop_on_signals(), server:
            report = run(server)
            report["server"] = {"target": str(target), "draft": str(draft), "args": server.args}
    drafted = sum(r["draft_n"] for r in report["results"])
    accepted = sum(r["draft_n_accepted"] for r in report["results"])
    report["draft_n"], report["draft_n_accepted"] = drafted, accepted
    report["acceptance"] = accepted / drafted if drafted else None
    if as_json:
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
