"""The command line's shared vocabulary: each option defined once, so a flag means one thing everywhere.

    --target / -t     the target model           --draft / -d      the drafter GGUF
    --json            a flag: print JSON          --force           replace an existing output
    --backend         which patched build         --llama-bin DIR   any build's bin folder instead
    --rpc H:P,...     the target over rpc-servers (llama-server --rpc; also honoured after --)
    --threads N       the llama.cpp program's CPU threads (-t)   --quantize-threads N  llama-quantize's
    -n/--n-predict N  new tokens per prompt       --seed N          a random seed
    --rounds N        paired measurement rounds   -o/--out PATH     the output (a file or a folder)
    --port N          a port to listen on         --parallel/-np N  llama-server slots
    -- ARGS...        extra llama-server arguments, for every command that starts a server
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import click

from .errors import ServerArgsError
from .hub.model_param import ModelParam
from .settings import Settings, option

# Facts the options state, owned here so that the base needs nothing above it (runner/ imports them)
BACKENDS = ("cpu", "cuda", "metal")  # the patched llama.cpp builds runner/build.py makes
STARTUP_TIMEOUT = 300.0               # seconds for the model(s) to load before /health must say ok

GGUF = click.Path(exists=True, dir_okay=False, path_type=Path)
SERVER_ARGS_METAVAR = "[-- LLAMA_SERVER_ARGS...]"


class OutputFile(click.Path):
    """A file to write, or with `folder` a folder to build. A file's name ending in a separator names a
    folder; Path() would drop the separator and a file of the folder's name would be written."""

    def __init__(self, folder: bool = False):
        super().__init__(file_okay=not folder, path_type=Path)
        self.folder, self.name = folder, "output"  # click names a Path "file" or "directory"

    def convert(self, value, param, ctx):
        if not self.folder and isinstance(value, str) and value.endswith(("/", os.sep)):
            self.fail(f"{value!r} ends with a separator, which names a folder; give a file name, e.g. "
                      f"{value}out.gguf", param, ctx)
        return super().convert(value, param, ctx)


OUTPUT_FILE = OutputFile()  # an existing folder: outputs.check_outputs says so


TARGET_HELP = ("The target model: its GGUF file, or on the Hub owner/name[@revision]:QUANT or "
               "owner/name[@revision]/path/file.gguf (fetched into the Hugging Face cache); convert and release "
               "also take its Hugging Face folder, local or owner/name[@revision].")


def target_option(*, required: bool = True, folder_ok: bool = False):
    """--target / -t. A Hub repo id arrives as a hub.HubRef (nothing is fetched while parsing): the command
    resolves it, hub.local_gguf where it runs the model. `folder_ok`: an HF folder or repository too."""
    return click.option("--target", "-t", "target", required=required, help=TARGET_HELP,
                        type=ModelParam(folder_ok=folder_ok))


def draft_option(*, required: bool = True, help: str = "The drafter GGUF made for that target."):
    return click.option("--draft", "-d", "draft", required=required, type=GGUF, help=help)


def prompts_option(*, required: bool = False):
    """--prompts FILE (runner/prompts.py reads it)."""
    return click.option("--prompts", "prompts_file", required=required,
                        type=click.Path(exists=True, dir_okay=False, path_type=Path),
                        help=r"One prompt per line (\n for a newline), or JSONL (a .jsonl file): one object a "
                             'line, {"messages": [{"role": "user", "content": "..."}]} rendered by the target\'s '
                             'chat template as llama-server renders it, or {"prompt": "..."}. Where it may be left '
                             "out: a built-in mix of code, math, prose and chat.")


exact_option = click.option(
    "--exact", is_flag=True,
    help="Batch-invariant verification on the CPU build: ggml-cpu's reference kernels (GGML_CPU_USE_REF=1, "
         "patch 0007; llama-server also --no-repack), so every row of a verify batch is computed as one decoded "
         "token is and speculative greedy output is token-identical to plain decoding, at some speed on "
         "batches; an rpc-server a head runs with --exact needs it too (docs/validate.md, \"Exact mode\").")
license_option = click.option(
    "--license", "license_id", metavar="ID",
    help="The drafter's Hub license id (written as general.license), when its README.md declares none or one "
         "this tool does not know; it never overrides a declared license (default: the README's `license:`, or "
         "stricter terms stated in its LICENSE files).")
temperature_option = click.option(
    "--temperature", type=click.FloatRange(0.0), default=0.0, show_default=True,
    help="0: greedy. Above 0: the target samples (its sampler decides every token, so the output keeps its "
         "distribution) while the drafter drafts greedily; validate then tests the distribution (see its help).")
host_option = click.option(
    "--host", default=None,
    help="Address to listen on. Default: 127.0.0.1 (this machine only); another address is reachable from "
         "the network, and llama rpc-server's protocol has no authentication: give it a private address.")
backend_option = click.option(
    "--backend", type=click.Choice(BACKENDS), default=None,
    help="Which patched llama.cpp build: `dflash-gguf llama build` makes it, the other commands run it. Default: "
         "metal on macOS, cuda when a CUDA toolkit (nvcc on PATH or CUDA_HOME) and an NVIDIA GPU are found, "
         "else cpu.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object on stdout.")
# --threads is the CPU threads of the llama.cpp program a command runs; llama-quantize's are another knob
threads_option = click.option("--threads", type=click.IntRange(min=1), default=None,
                              help="CPU threads of the llama.cpp program it runs (its -t; train: torch's too). "
                                   "Default: llama.cpp's own.")
quantize_threads_option = click.option("--quantize-threads", type=click.IntRange(min=1), default=None,
                                       help="Threads for llama-quantize. Default: every CPU.")
force_option = click.option("--force", is_flag=True,
                            help="Replace the output if it exists (a folder only when its "
                                 ".dflash-gguf-manifest.json shows that an earlier run of this command wrote every "
                                 "file in it, unchanged).")
seed_option = click.option("--seed", type=click.IntRange(0), default=None,
                           help="Random seed: the same seed, the same result.")


def n_predict_option(default: int | None = 64):
    return click.option("-n", "--n-predict", "n_predict", type=click.IntRange(1, 16384), default=default,
                        show_default=default is not None, help="New tokens per prompt.")


def rounds_option(default: int | None = 3):
    """--rounds: interleaved rounds of a speed measurement (runner/speed.py); 0 where a command can do
    without speed (validate: the proof only), refused by those that measure nothing else (`rounds_needed`)."""
    return click.option(
        "--rounds", type=click.IntRange(0, 50), default=default, show_default=default is not None,
        help="Paired rounds per setting measured: in each, every request goes to the target alone's server and "
             "to the drafter's, one after the other, which goes first alternating (a ratio of two things "
             "measured side by side). The speedup is the median of the rounds with their range; one above "
             "tau, or whose range is wider than its distance from 1x, or from fewer than 3 rounds, is "
             "reported as not measured reliably. From 9 rounds on, the median's 95 % interval (narrower "
             "than the range) is what must not be wider than the effect. 0: no speed measured (validate: "
             "the proof only; bench and tune, which measure speed, refuse it).")


def rounds_needed(command: str, rounds: int | None) -> list[str]:
    """The problem line of `--rounds 0` for a command whose result is a speed measurement."""
    if rounds != 0:
        return []
    return [f"--rounds 0: {command} measures speed; give 1 or more (at least 3 for a figure that can stand), "
            "or leave it out"]


fresh_servers_option = click.option(
    "--fresh-servers", is_flag=True,
    help="Start a new pair of servers (the target alone's and the drafter's) for each round, the one started "
         "first alternating, instead of one pair for the whole run: two llama-server processes of one command "
         "can differ by several per cent for as long as they run (docs/speed.md#fresh-servers), an offset "
         "every round of one pair shares; with new pairs it lands in the rounds' range. Costs two server "
         "starts per round.")


def out_option(*, required: bool = False, folder: bool = False, dest: str = "out"):
    """-o/--out: the command's output, a file (convert) or a folder it builds (`folder`: release, train)."""
    return click.option("-o", "--out", dest, required=required, type=OutputFile(folder),
                        help="Where the output goes (the description above says what it is): built beside it and "
                             "renamed into place when complete; an existing one is replaced only with --force, a "
                             "folder only when its .dflash-gguf-manifest.json shows that an earlier run of this "
                             "command wrote every file in it, unchanged (a folder holding anything else, your own "
                             "README.md, LICENSE or .gguf files included, is refused and left as it is).")


def port_option(default: int | None = None):
    return click.option("--port", type=click.IntRange(0, 65535), default=default, show_default=default is not None,
                        help="Port to listen on; 0, or no default shown: a free one (the address is printed).")


parallel_option = click.option(
    "--parallel", "-np", type=click.IntRange(1, 256), default=None,
    help="Server slots (requests decoded together). Default: 1; DFlash acceptance drops with many slots "
         "(llama.cpp #27117).")


def build_options(f):
    """--backend and --llama-bin: which llama.cpp build a command runs."""
    f = click.option(
        "--llama-bin", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
        envvar="DFLASH_GGUF_LLAMA_BIN",
        help="The bin folder of another llama.cpp build to run instead of the patched one "
             "(env DFLASH_GGUF_LLAMA_BIN); overrides --backend.")(f)
    return backend_option(f)


def parse_rpc(value: str, flag: str = "--rpc") -> tuple[str, ...]:
    """`host:port[,host:port...]` (llama-server --rpc) as a tuple; ServerArgsError on a bad entry."""
    servers = tuple(part.strip() for part in str(value).split(","))
    for server in servers:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535 or "/" in host:
            raise ServerArgsError(f"{flag} {value!r}: {server!r} is not HOST:PORT; give the address of each "
                                  "ggml-rpc-server, e.g. 192.168.1.10:50052,192.168.1.11:50052")
    return servers


def _rpc_servers(_ctx, _param, value: str | None) -> str | None:
    return ",".join(parse_rpc(value)) if value is not None else None


rpc_option = click.option(
    "--rpc", default=None, metavar="HOST:PORT[,...]", callback=_rpc_servers,
    help="Spread the target's layers over llama.cpp RPC servers (`ggml-rpc-server` from `dflash-gguf llama "
         "build` on each host): llama-server --rpc. The same after `--` is honoured. The drafter follows "
         "--device unless -devd is given after `--` (docs/llama.md: a target across hosts).")


AUTO = "auto"  # --spec-draft-n-max auto: the draft-length controller (ggml_patches/0008)


class DraftMaxType(click.ParamType):
    """A draft length of at least 1, or `auto`."""

    name = "N|auto"

    def convert(self, value, param, ctx):
        if isinstance(value, int) or value == AUTO:
            return value
        text = str(value).strip().lower()
        if text == AUTO:
            return AUTO
        try:
            number = int(text)
        except ValueError:
            number = 0
        if number < 1:
            self.fail(f"{value!r}: give a whole number of at least 1, or auto", param, ctx)
        return number


DRAFT_MAX = DraftMaxType()


def server_options(f):
    """The options of the commands that start llama-server. Host, port, slots and draft length may
    also be given after `--` in llama-server's own spelling; the runner then uses those."""
    for option in reversed([
        host_option,
        port_option(),
        parallel_option,
        click.option("--draft-max", type=DRAFT_MAX, default=None,
                     help="Longest draft, or `auto`: llama-server chooses each step's draft length, 0 (a plain "
                          "target step) up to what the drafter was trained for, from the acceptance it sees "
                          "and what each verify batch costs on this machine (docs/speed.md). Default: what the "
                          "drafter was trained for (dflash.block_size - 1; a whole block for anchor-first DSpark), "
                          "or what `tune` chose."),
        click.option("--log", "log_path", type=OUTPUT_FILE, default=None,
                     help="Keep llama-server's log in this file. Default: a temporary file, "
                          "removed after a clean stop."),
        click.option("--startup-timeout", type=click.FloatRange(min=1), default=STARTUP_TIMEOUT,
                     show_default=True, help="Seconds to wait for the models to load."),
        rpc_option,
    ]):
        f = option(f)
    return f


@dataclass(frozen=True, kw_only=True)
class ServerSettings(Settings):
    """The fields `build_options` and `server_options` give, and the arguments after `--`: the base of the
    settings of a command that starts llama-server (dflash_gguf/settings.py)."""

    backend: str | None = None
    llama_bin: Path | None = None
    host: str | None = None
    port: int | None = None
    parallel: int | None = None
    draft_max: int | str | None = None
    log_path: Path | None = option("--log")
    startup_timeout: float = STARTUP_TIMEOUT
    rpc: str | None = None
    server_args: tuple[str, ...] = ()


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
