"""The command line's shared vocabulary: each option defined once, so a flag means one thing everywhere.

    --target / -t     the target model           --draft / -d      the drafter GGUF
    --json            a flag: print JSON          --force           replace an existing output
    --backend         which patched build         --llama-bin DIR   any build's bin folder instead
    -- ARGS...        extra llama-server arguments, for every command that starts a server
"""

from __future__ import annotations

from pathlib import Path

import click

from .runner.build import BACKENDS
from .runner.server import STARTUP_TIMEOUT

GGUF = click.Path(exists=True, dir_okay=False, path_type=Path)
SERVER_ARGS_METAVAR = "[-- LLAMA_SERVER_ARGS...]"


def target_option(*, required: bool = True, folder_ok: bool = False, hub: bool = False,
                  help: str = "The target model GGUF."):
    """`hub`: a Hub repo id is taken too (convert/model_param.py; the command resolves it)."""
    if hub:
        from .convert.model_param import ModelParam

        kind = ModelParam(folder_ok=folder_ok)
    else:
        kind = click.Path(exists=True, dir_okay=folder_ok, path_type=Path)
    return click.option("--target", "-t", "target", required=required, help=help, type=kind)


def draft_option(*, required: bool = True, help: str = "The drafter GGUF made for that target."):
    return click.option("--draft", "-d", "draft", required=required, type=GGUF, help=help)


def prompts_option(default: str):
    """--prompts FILE: one prompt per line; `default` says what is used without it."""
    return click.option("--prompts", "prompts_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                        help=rf"One prompt per line (\n for a newline). Default: {default}")


exact_option = click.option(
    "--exact", is_flag=True,
    help="Batch-invariant verification (llama-server --no-repack on the CPU build): speculative greedy output "
         "token-identical to plain decoding, at some speed (docs/validate.md, \"Exact mode\").")
json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object on stdout.")
force_option = click.option("--force", is_flag=True, help="Replace the output if it exists.")


def build_options(f):
    """--backend and --llama-bin: which llama.cpp build a command runs."""
    f = click.option(
        "--llama-bin", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
        envvar="DFLASH_GGUF_LLAMA_BIN",
        help="The bin folder of another llama.cpp build to run instead of the patched one "
             "(env DFLASH_GGUF_LLAMA_BIN); overrides --backend.")(f)
    return click.option(
        "--backend", type=click.Choice(BACKENDS), default=None,
        help="Which patched llama.cpp build to run (made by `dflash-gguf llama build`). Default: metal "
             "on macOS, cuda when a CUDA toolkit and an NVIDIA driver are found, else cpu.")(f)


def server_options(f):
    """The options of the commands that start llama-server. Host, port, slots and draft length may
    also be given after `--` in llama-server's own spelling; the runner then uses those."""
    for option in reversed([
        click.option("--host", default=None, help="Address to listen on. Default: 127.0.0.1."),
        click.option("--port", type=click.IntRange(0, 65535), default=None,
                     help="Port to listen on. Default: a free port."),
        click.option("--parallel", "-np", type=click.IntRange(min=1), default=None,
                     help="Server slots (requests decoded together). Default: 1; DFlash acceptance drops "
                          "with many slots (llama.cpp #27117)."),
        click.option("--draft-max", type=click.IntRange(min=1), default=None,
                     help="Longest draft. Default: what the drafter was trained for "
                          "(dflash.block_size - 1; a whole block for anchor-first DSpark)."),
        click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Keep llama-server's log in this file. Default: a temporary file, "
                          "removed after a clean stop."),
        click.option("--startup-timeout", type=click.FloatRange(min=1), default=STARTUP_TIMEOUT,
                     show_default=True, help="Seconds to wait for the models to load."),
    ]):
        f = option(f)
    return f


class ServerArgsCommand(click.Command):
    """A command that passes everything after the first `--` to llama-server, as `server_args`
    (so positional arguments, e.g. generate's prompts, and server arguments never mix)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        tail: tuple[str, ...] = ()
        if "--" in args:
            cut = args.index("--")
            args, tail = args[:cut], tuple(args[cut + 1:])
        rest = super().parse_args(ctx, args)
        ctx.params["server_args"] = tail
        return rest

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return [*super().collect_usage_pieces(ctx), SERVER_ARGS_METAVAR]
