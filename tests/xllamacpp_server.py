"""Stock llama.cpp as a `llama-server`: PyPI `xllamacpp` (pinned in the `test-stock` extra; a prebuilt
CPU wheel whose `Server(CommonParams)` runs llama.cpp's unmodified HTTP server in-process) behind the
llama-server command line the runner starts, so `runner.server.LlamaServer` owns it like any build:

    bin_dir = shim_folder(tmp_path)                     # holds an executable `llama-server`
    with LlamaServer(target, ["-md", draft, "--spec-type", "draft-dflash"], bin_dir=bin_dir) as server:
        server.client.complete("The capital of France is", 16)

It runs in a process of its own, so an abort in llama.cpp (GGML_ASSERT) is an exit status the test
observes, not the end of the test run. Only the options the runner and the tests give are taken; any
other is refused (exit 2), so nothing is silently dropped.
"""

from __future__ import annotations

import argparse
import os
import signal
import stat
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def shim_folder(folder: Path) -> Path:
    """`folder` with an executable `llama-server` that runs xllamacpp's server; the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "llama-server"
    exe.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(REPO)!r})\n"
                   "from tests.xllamacpp_server import main\nsys.exit(main(sys.argv[1:]))\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return folder


@dataclass
class Run:
    tokens: list[list[int]]
    drafted: int
    accepted: int


# The same for both builds, and no part of what is compared: no memory-fitting pass (it loads every
# model once more: most of a start-up here), no gdb backtrace after an abort.
RUN_ARGS = ("-c", "1024", "-t", "1", "-fit", "off")
RUN_ENV = {"GGML_NO_BACKTRACE": "1"}


def run_prompts(bin_dir: Path, target: Path, draft: Path | None, prompts: list[str], n: int, log: Path) -> Run:
    """The launch recipe on `bin_dir`'s llama-server (stock or patched), greedy, `n` tokens per prompt,
    without the converter's pair check (slow on a 152k-token vocabulary; a misfit pair is what some
    callers test)."""
    from dflash_gguf.runner.launch import launch_recipe

    launch = launch_recipe(target, draft, check=False).adding(*RUN_ARGS)
    with launch.server(bin_dir=bin_dir, log_path=log, env={**os.environ, **RUN_ENV}) as server:
        answers = [server.client.complete(p, n, ignore_eos=True) for p in prompts]
    return Run([a.tokens for a in answers], sum(a.draft_n for a in answers), sum(a.draft_n_accepted for a in answers))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llama-server (xllamacpp)", allow_abbrev=False)
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("-md", "--model-draft")
    p.add_argument("--spec-type", choices=("draft-dflash", "draft-dspark"))
    p.add_argument("--spec-draft-n-max", type=int)
    p.add_argument("--metrics", action="store_true")
    p.add_argument("-np", "--parallel", type=int, default=1)
    p.add_argument("-c", "--ctx-size", type=int, default=4096)
    p.add_argument("-t", "--threads", type=int, default=1)
    p.add_argument("-fit", "--fit", choices=("on", "off"), default="on")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    import xllamacpp as xlc

    params = xlc.CommonParams()
    params.model.path = args.model
    params.hostnames = [args.host]
    params.port = args.port
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx_size
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = args.threads
    params.endpoint_metrics = args.metrics
    params.fit_params = args.fit == "on"
    if args.model_draft:
        kind = {"draft-dflash": "DFLASH", "draft-dspark": "DSPARK"}[args.spec_type or "draft-dflash"]
        params.speculative.types = [getattr(xlc.common_speculative_type, f"COMMON_SPECULATIVE_TYPE_DRAFT_{kind}")]
        params.speculative.draft.mparams.path = args.model_draft
        if args.spec_draft_n_max:
            params.speculative.draft.n_max = args.spec_draft_n_max
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server = xlc.Server(params)  # loads the models and starts listening; raises when loading fails
    except Exception as err:  # llama.cpp's own lines (the reason) are already in the log above
        print(f"error: xllamacpp could not start the server: {err}", file=sys.stderr, flush=True)
        return 1
    while not stop.wait(0.5):
        pass
    del server
    sys.stderr.flush()
    os._exit(0)  # the in-process server's threads are done; skip the interpreter's slow teardown


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
