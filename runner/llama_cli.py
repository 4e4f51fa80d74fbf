"""`dflash-gguf llama ...`: build the patched llama.cpp and find it."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from dflash_gguf.progress import printer
from dflash_gguf.errors import LlamaBuildError, ServerError
from dflash_gguf.options import (backend_option, build_options, exact_option, host_option, json_option, port_option,
                       threads_option)
from . import build as _build
from .rpc import RpcServer
from .server import DEFAULT_HOST, stop_on_signals

_source_option = click.option(
    "--source", "source_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
    help="A llama.cpp checkout to patch and build instead of the pinned tree "
         "(llama-cpp-python 0.3.36's vendor/llama.cpp).")


@click.group("llama")
def llama_group() -> None:
    """The patched llama.cpp this project runs drafters with.

    \b
    The pinned tree plus ggml_patches/series is built with CMake into the cache
    (~/.cache/dflash-gguf/llama/<key>/bin), where <key> hashes the source tree, the
    patches and the backend: changing a patch gives a new key, and the rebuild only
    recompiles what the patch touched.
    """


@llama_group.command("build")
@backend_option
@_source_option
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Parallel compile jobs. Default: the number of CPUs.")
@click.option("--rebuild", "force", is_flag=True, help="Rebuild and republish even if this key is already built.")
@click.option("--cuda-arch", default=None, metavar="CC[;CC...]",
              help="CUDA builds: the compute capabilities to compile for, e.g. 90 (H100/H200), "
                   "89 (RTX 40xx), 86 (RTX 30xx), or 80;86. Default: `native`, detected from the GPU "
                   "here; needed where no GPU is (a CUDA toolkit alone).")
@click.option("--prepare-only", is_flag=True,
              help="Fetch the pinned tree and apply the patch series, then stop before compiling; "
                   "prints the patched source folder.")
@json_option
def build_command(backend: str | None, source_dir: Path | None, jobs: int | None, force: bool,
                  cuda_arch: str | None, prepare_only: bool, as_json: bool) -> None:
    """Patch, configure and build llama.cpp, then print the folder of its binaries.

    \b
    Builds llama-server, llama-cli, llama-quantize, llama-speculative-simple,
    llama-bench and ggml-rpc-server (llama.cpp's rpc-server: the RPC backend is in every
    build, for `--rpc HOST:PORT,...`) with their shared libraries. A build that already exists for the
    current key is reused. Progress goes to stderr; the bin folder to stdout.

    \b
    Examples:
      dflash-gguf llama build
      dflash-gguf llama build --backend cpu -j 4
      dflash-gguf llama build --source ~/src/llama.cpp --backend cuda
      dflash-gguf llama build --backend cuda --cuda-arch 90   # no GPU here: name it
      dflash-gguf llama build --prepare-only     # download + patch, no compile
    """
    started = time.monotonic()

    def progress(message: str) -> None:
        printer()(f"[{time.monotonic() - started:6.1f}s] {message}")

    if prepare_only:
        src = _build.prepare(backend=backend, source_dir=source_dir, progress=progress)
        click.echo(json.dumps({"source_dir": str(src)}) if as_json else str(src))
        return
    if cuda_arch and (backend or _build.default_backend()) != "cuda":
        raise LlamaBuildError("--cuda-arch is for CUDA builds: add --backend cuda")
    result = _build.build(backend=backend, source_dir=source_dir, jobs=jobs, progress=progress, force=force,
                          cuda_arch=cuda_arch)
    if not result.built:
        progress(f"build {result.key} is up to date")
    if as_json:
        click.echo(json.dumps({**result.manifest, "bin_dir": str(result.bin_dir)}, indent=2))
    else:
        click.echo(str(result.bin_dir))


@llama_group.command("path")
@backend_option
@_source_option
def path_command(backend: str | None, source_dir: Path | None) -> None:
    """Print the bin folder of the build for the current key (exit status 2, one line, when it
    is not built).

    \b
    Examples:
      dflash-gguf llama path
      "$(dflash-gguf llama path --backend cuda)/llama-server" --version
    """
    found = _build.find_build(backend, source_dir)
    if found is None:
        key = _build.key_for(backend, source_dir)
        raise LlamaBuildError(f"no llama.cpp build for key {key} (backend {backend or _build.default_backend()}); "
                              "run `dflash-gguf llama build` first")
    click.echo(str(found))


@llama_group.command("rpc-server")
@build_options
@host_option
@port_option(default=50052)
@threads_option
@click.option("--device", default=None, help="The devices to offer, e.g. CUDA0 (rpc-server -d). Default: all.")
@exact_option
def rpc_server_command(backend: str | None, llama_bin: Path | None, host: str | None, port: int, threads: int | None,
                       device: str | None, exact: bool) -> None:
    """Offer this host's CPU or GPU to a llama-server elsewhere (ggml-rpc-server), until Ctrl-C.

    \b
    The head then spreads the target's layers over the hosts that run this:
      dflash-gguf serve -t T.gguf -d D.gguf --rpc 10.0.0.2:50052,10.0.0.3:50052 -- -ngl 99
    One rpc-server serves one llama-server at a time. Prints HOST:PORT once it listens.

    \b
    Examples (on each host that lends its device):
      dflash-gguf llama rpc-server --host 0.0.0.0 --port 50052
      dflash-gguf llama rpc-server --host 0.0.0.0 --backend cuda
    """

    server = RpcServer(bin_dir=_build.find_bin_dir(backend, llama_bin), host=host or DEFAULT_HOST, port=port or None,
                       threads=threads, device=device, exact=exact)
    try:
        with stop_on_signals(), server:
            click.echo(server.address)
            sys.stdout.flush()
            click.echo(f"ggml-rpc-server pid {server.pid} listening; log {server.log_path}. Ctrl-C stops it.", err=True)
            rc = server.wait()
            raise ServerError(f"ggml-rpc-server exited by itself with status {rc} (log: {server.log_path})")
    except KeyboardInterrupt:
        click.echo("stopped ggml-rpc-server", err=True)


commands = [llama_group]
