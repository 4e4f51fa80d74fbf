"""One `ggml-rpc-server` process (llama.cpp's rpc-server), owned like a LlamaServer.

    with RpcServer(bin_dir=bin_dir, threads=1) as a, RpcServer(bin_dir=bin_dir, threads=1) as b:
        launch = launch_recipe(target, draft, rpc=[a.address, b.address], server_args=["-devd", "none"])
        with launch.server(bin_dir=bin_dir) as server:      # the target's layers on a and b
            ...
    # both processes are gone here, whatever happened inside the block

An rpc-server offers one host's devices (its CPU, or a GPU) to a llama-server elsewhere, over TCP
with no authentication: bind it to an address only the head can reach (it warns when that is not
127.0.0.1). It is ready when its port accepts a connection.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from dflash_gguf.errors import LlamaBuildError, ServerStartError
from . import build as _build
from .launch import EXACT_ENV
from .server import DEFAULT_HOST, STOP_GRACE, error_line, free_port, reap, spawn

EXE = "ggml-rpc-server"
STARTUP_TIMEOUT = 60.0


class RpcServer:
    """`ggml-rpc-server -H HOST -p PORT [-t N] [-d DEVICE]`: started on `__enter__`, reaped on exit
    (`exact`: with --exact's environment, for a head that serves with --exact).
    `port=None` picks a free one; its output goes to a temporary log, kept when start-up fails."""

    def __init__(self, *, bin_dir: str | Path | None = None, backend: str | None = None, host: str = DEFAULT_HOST,
                 port: int | None = None, threads: int | None = None, device: str | None = None,
                 exact: bool = False, startup_timeout: float = STARTUP_TIMEOUT, stop_grace: float = STOP_GRACE):
        bin_dir = Path(bin_dir) if bin_dir is not None else _build.find_bin_dir(backend)
        self.exe = bin_dir / (f"{EXE}.exe" if sys.platform == "win32" else EXE)
        if not self.exe.is_file():
            raise LlamaBuildError(f"{self.exe}: not found; this build has no RPC server: rebuild it with "
                                  "`dflash-gguf llama build` (every build since flags revision 3 has one)")
        self.host, self.port = host, port
        self.threads, self.device = threads, device
        self.startup_timeout, self.stop_grace = startup_timeout, stop_grace
        # --exact: the layers this server computes for the head must use the reference kernels too
        self.env = _build.runtime_env(bin_dir, {**os.environ, **EXACT_ENV} if exact else None)
        self.log_path: Path | None = None
        self._proc = None
        self._log_handle = None

    @property
    def address(self) -> str:
        """HOST:PORT, as llama-server's --rpc takes it."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def command(self) -> list[str]:
        cmd = [str(self.exe), "-H", self.host, "-p", str(self.port)]
        cmd += ["-t", str(self.threads)] if self.threads else []
        return cmd + (["-d", self.device] if self.device else [])

    def __enter__(self) -> "RpcServer":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> "RpcServer":
        if self.port is None:
            self.port = free_port(self.host)
        else:  # our readiness probe would take another listener for this server
            with socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET) as probe:
                try:
                    probe.bind((self.host, self.port))
                except OSError as err:
                    raise ServerStartError(f"{EXE}: {self.address} is in use ({err.strerror}); give another --port",
                                           None, None) from None
        fd, name = tempfile.mkstemp(prefix="ggml-rpc-server-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)
        self._log_handle = open(self.log_path, "ab")
        try:
            self._proc = spawn(self.command(), self._log_handle, self.env)
            self._wait_ready()
        except BaseException:
            self.stop(keep_log=True)
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while True:
            rc = self._proc.poll()
            if rc is not None:
                lines = self.log_path.read_text(errors="replace").splitlines() if self.log_path else []
                raise ServerStartError(f"{EXE} exited with status {rc} during start-up: "
                                       f"{error_line(lines) or 'no output'} (log: {self.log_path})", rc, self.log_path)
            with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), timeout=1.0):
                return
            if time.monotonic() > deadline:
                raise ServerStartError(f"{EXE} did not listen on {self.address} within {self.startup_timeout:g} s "
                                       f"(log: {self.log_path})", None, self.log_path)
            time.sleep(0.1)

    def wait(self, timeout: float | None = None) -> int:
        """Block until the server exits by itself; its return code."""
        return self._proc.wait(timeout)

    def stop(self, keep_log: bool = False) -> int | None:
        proc, self._proc = self._proc, None
        rc = None
        try:
            if proc is not None:
                keep_log = keep_log or proc.poll() is not None
                rc = reap(proc, self.stop_grace, EXE)
        finally:
            if self._log_handle is not None:
                self._log_handle.close()
                self._log_handle = None
            if not keep_log and self.log_path is not None:
                with contextlib.suppress(OSError):
                    self.log_path.unlink()
                self.log_path = None
        return rc
