"""One `llama-server` process, owned by a context manager.

    launch = launch_recipe("target.gguf", "dflash-target.gguf")    # runner/launch.py: checks the pair
    with launch.server() as server:                                 # starts, waits for /health
        answer = server.client.complete("The capital of France is", n_predict=32)
    # the process is gone here, whatever happened inside the block

`LlamaServer` starts the binary of a llama.cpp build with its output captured to a log file, waits
for `/health` to answer ok, and always reaps the process: SIGTERM, then SIGKILL after a grace
period, on normal exit, on an exception and on KeyboardInterrupt. On Linux the server also gets
SIGTERM if the Python process dies without running its cleanup. When the server exits during
start-up (a drafter refused by the patched llama.cpp, a port in use, an abort) the error quotes the
line of its log that says why. It talks to the server through a `LlamaClient` (`server.client`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Sequence

from dflash_gguf.errors import LlamaBuildError, ServerError, ServerStartError
from dflash_gguf.options import STARTUP_TIMEOUT
from dflash_gguf.signals import raise_on_terminate
from . import build as _build, server_log
from .client import LlamaClient

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
STOP_GRACE = 10.0         # seconds between SIGTERM and SIGKILL

# llama.cpp logs this while it measures memory; it is not an error
_HARMLESS = ("ctx_other",)
_LEVEL_PREFIX = re.compile(r"^\s*\d+\.\d+\.\d+\.\d+ ([DIWE]) ")  # "0.01.044.800 E text"
_BIND_FAILED = "couldn't bind HTTP server socket"

# ---------------------------------------------------------------------------------------------
# The process
# ---------------------------------------------------------------------------------------------

def free_port(host: str = DEFAULT_HOST) -> int:
    """A TCP port nobody listens on right now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _strip_prefix(line: str) -> str:
    match = _LEVEL_PREFIX.match(line)
    return line[match.end():].strip() if match else line.strip()


def error_line(lines: Sequence[str]) -> str | None:
    """The line of a llama-server log that best says why it stopped."""
    lines = [line.rstrip() for line in lines if line.strip()]
    useful = [line for line in lines if not any(h in line for h in _HARMLESS)
              and not re.match(r"#\d+\s", line)]  # gdb backtrace frames printed after an abort

    def level(line: str) -> str | None:
        match = _LEVEL_PREFIX.match(line)
        return match.group(1) if match else None

    tests = (
        lambda l: re.search(r"(^|\s)dflash: ", l) is not None and level(l) in ("E", None),  # patched checks
        lambda l: "GGML_ASSERT" in l or "GGML_ABORT" in l,
        lambda l: re.match(r"\S+\.(c|cpp|cu|m):\d+: \S", l) is not None,  # GGML_ABORT's "file:line: message"
        lambda l: level(l) == "E" and "exiting due to" not in l,
        lambda l: re.search(r"\berror\b|\bfailed\b|terminate called|what\(\)", l, re.IGNORECASE) is not None,
    )
    for test in tests:
        hits = [line for line in useful if test(line)]
        if hits:
            return _strip_prefix(hits[0])
    return _strip_prefix(useful[-1]) if useful else None


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def _pdeathsig_hook():
    """A function for Popen's preexec_fn that makes the child get SIGTERM when its parent dies
    (Linux PR_SET_PDEATHSIG); None where that is not available. libc is resolved here, in the
    parent, so the child runs no import between fork and exec."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None  # the signal follows the creating *thread*; only the main thread lives as long as we do
    try:
        # extra: Linux only (prctl)
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    sigterm = int(signal.SIGTERM)

    def hook() -> None:
        prctl(1, sigterm)  # PR_SET_PDEATHSIG

    return hook


def spawn(cmd: Sequence[str], log_handle, env: dict[str, str]) -> subprocess.Popen:
    """Start a process we own: output into `log_handle`, no terminal signals (we stop it ourselves),
    SIGTERM when we die (Linux)."""
    log.info("starting %s", " ".join(cmd))
    return subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=log_handle, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True, preexec_fn=_pdeathsig_hook())


def reap(proc: subprocess.Popen, grace: float, what: str) -> int:
    """SIGTERM, SIGKILL after `grace` seconds, and wait: the process is gone when this returns,
    a second KeyboardInterrupt while waiting included. Its return code."""
    try:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) ignored SIGTERM for %g s; killing it", what, proc.pid, grace)
    finally:
        if proc.poll() is None:
            proc.kill()
        rc = proc.wait()
    return rc


class LlamaServer:
    """A `llama-server` process: started on `__enter__` (or `start()`), always reaped on exit.

    `model` is the target GGUF, `args` every other llama-server argument (the drafter's come from
    the launch recipe, runner/launch.py). `port=None` picks a free port. `bin_dir` defaults to the
    patched build for `backend` (`runner.build.find_bin_dir`). The server's output goes to
    `log_path` (default: a temporary file, removed after a clean stop and kept when start-up
    failed so that the error can point at it). `client` talks to it once it is started.
    """

    def __init__(self, model: str | Path, args: Sequence[str] = (), *, bin_dir: str | Path | None = None,
                 backend: str | None = None, host: str = DEFAULT_HOST, port: int | None = None,
                 log_path: str | Path | None = None, startup_timeout: float = STARTUP_TIMEOUT,
                 stop_grace: float = STOP_GRACE, request_timeout: float | None = 600.0,
                 env: dict[str, str] | None = None, api_key: str | None = None):
        self.client = LlamaClient("", timeout=request_timeout, api_key=api_key)
        if bin_dir is None:
            bin_dir = _build.find_bin_dir(backend)
        exe = Path(bin_dir) / ("llama-server.exe" if sys.platform == "win32" else "llama-server")
        if not exe.is_file():
            raise LlamaBuildError(f"{exe}: not found; rebuild with `dflash-gguf llama build --rebuild`, "
                                  "or give --llama-bin the bin folder of a build with llama-server")
        self.exe = exe
        self.model = Path(model)
        self.args = [str(a) for a in args]
        self.host = host
        self.port = port
        self._fixed_port = bool(port)  # None or 0: pick a free one
        self.startup_timeout = startup_timeout
        self.stop_grace = stop_grace
        self.env = _build.runtime_env(exe.parent, env)
        self._own_log = log_path is None
        self.log_path = Path(log_path) if log_path is not None else None
        self._proc: subprocess.Popen | None = None
        self._log_handle = None

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}" if self.port else ""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def command(self) -> list[str]:
        return [str(self.exe), "-m", str(self.model), "--host", self.host, "--port", str(self.port), *self.args]

    def __enter__(self) -> "LlamaServer":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> "LlamaServer":
        """Start the server and wait until /health says ok; ServerStartError if it does not."""
        if self._proc is not None:
            raise ServerError("this LlamaServer is already running")
        if not self.model.is_file():
            raise ServerError(f"{self.model}: no such model file")
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        else:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log_path.write_bytes(server_log.HEADER)  # this run's log only: errors are quoted from it
        try:
            for attempt in range(3):
                if not self._fixed_port:
                    self.port = free_port(self.host)
                self.client.url = self.url
                self._spawn()
                try:
                    self._wait_ready()
                    return self
                except ServerStartError as err:
                    self.stop(keep_log=True)
                    # another process took the port between free_port() and the bind: try another
                    if self._fixed_port or attempt == 2 or _BIND_FAILED not in self.log_tail(20):
                        raise err
            raise AssertionError("unreachable")
        except BaseException as err:
            self.stop(keep_log=not isinstance(err, KeyboardInterrupt))  # interrupted: nothing to read in it
            raise

    def _spawn(self) -> None:
        assert self.log_path is not None
        self._log_handle = open(self.log_path, "ab")
        self._proc = spawn(self.command(), self._log_handle, self.env)

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        delay = 0.05
        while True:
            rc = self._proc.poll()
            if rc is not None:
                raise self._start_error(rc)
            if self.client.health(timeout=2.0):
                log.info("llama-server ready at %s (pid %d)", self.url, self._proc.pid)
                return
            if time.monotonic() > deadline:
                tail = " | ".join(_strip_prefix(l) for l in self.log_tail(5).splitlines() if l.strip())
                raise ServerStartError(
                    f"llama-server did not become ready within {self.startup_timeout:g} s; "
                    f"last log lines: {tail or '(empty)'} (log: {self.log_path})",
                    None, self.log_path)
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _start_error(self, rc: int) -> ServerStartError:
        reason = error_line(self.log_tail(400).splitlines()) or "no output"
        if rc < 0:
            how = f"crashed ({_signal_name(rc)})"
        else:
            how = f"exited with status {rc}"
        return ServerStartError(f"llama-server {how} during start-up: {reason} (log: {self.log_path})",
                                rc, self.log_path)

    def log_tail(self, n_lines: int = 40) -> str:
        """The last lines of the server's log."""
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - 256 * 1024))
                data = fh.read()
        except OSError:
            return ""
        return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-n_lines:])

    def wait(self, timeout: float | None = None) -> int:
        """Block until the server exits by itself; its return code."""
        if self._proc is None:
            raise ServerError("this LlamaServer is not running")
        return self._proc.wait(timeout)

    def stop(self, keep_log: bool = False) -> int | None:
        """Stop the server (SIGTERM, SIGKILL after `stop_grace` s) and reap it; its return code.

        A second KeyboardInterrupt while waiting still kills and reaps the process. The log is
        kept (not deleted) with `keep_log` or when the server had died on its own.
        """
        proc, self._proc = self._proc, None
        rc = None
        try:
            if proc is not None:
                keep_log = keep_log or proc.poll() is not None  # it died by itself: its log says why
                rc = reap(proc, self.stop_grace, "llama-server")
        finally:
            if self._log_handle is not None:
                self._log_handle.close()
                self._log_handle = None
            if self._own_log and not keep_log and self.log_path is not None:
                with contextlib.suppress(OSError):
                    self.log_path.unlink()
                self.log_path = None
        return rc



def stop_on_signals():
    """SIGTERM, SIGHUP and SIGINT stop the block as Ctrl-C does, so the context managers inside it
    (a LlamaServer) clean up."""
    return raise_on_terminate(sigint=True)

