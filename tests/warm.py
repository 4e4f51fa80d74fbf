"""A new process per command, without paying for its imports each time: a warm process imports once,
then forks a child per request, with the request's argv, environment, working folder and streams.

The child is a real process (its own pid, exit code, signals, environment), so what only a new process
shows still shows: an environment read at import (huggingface_hub reads HF_ENDPOINT when imported,
so the warm process never imports it), exit codes, a traceback, atexit work. What it does not show is
the interpreter's own start and the entry point script: tests/test_cli.py keeps real subprocesses
for those, as do the tests that signal or watch a command while it runs (subprocess.Popen).

Forking before anything has started threads is safe: the warm process only imports.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

_SERVER = r"""
import atexit, json, os, sys, traceback
exec(sys.argv[1])  # the preamble: imports, and run(), which reads sys.argv as a program's main does
print("ready", flush=True)
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.dup2(os.open(request["stdin"], os.O_RDONLY), 0)
            for fd, name in ((1, "stdout"), (2, "stderr")):
                os.dup2(os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), fd)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            sys.argv = request["argv"]
            run()
        except SystemExit as e:
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)
    print(pid, flush=True)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


class WarmProcess:
    """One warm process per test worker and preamble; requests are served one at a time."""

    def __init__(self, preamble: str, env: dict[str, str] | None = None):
        self._preamble, self._env = preamble, env
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._pending = b""

    def _line(self, timeout: float | None = None) -> str | None:
        """The warm process's next line; None if none came within `timeout` seconds."""
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._pending:
            if timeout is not None and not select.select([fd], [], [], timeout)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError(f"the warm process ended ({self._preamble!r})")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode()

    def _started(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen([sys.executable, "-c", _SERVER, self._preamble], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, env=self._env, bufsize=0)
            self._pending = b""
            atexit.register(self._proc.kill)
            if self._line() != "ready":
                raise RuntimeError(f"the warm process did not start ({self._preamble!r})")
        return self._proc

    def run(self, argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | str | None = None,
            timeout: float | None = None, input: str | None = None, stdout: Path | None = None,
            stderr: Path | None = None) -> subprocess.CompletedProcess:
        """As subprocess.run(argv, capture_output=True, text=True, ...) would answer; `stdout`/`stderr`
        name files to write instead of capturing (the same file for both: one log)."""
        with tempfile.TemporaryDirectory(prefix="warm-") as tmp, self._lock:
            tmp = Path(tmp)
            (tmp / "stdin").write_text(input or "")
            out, err = stdout or tmp / "stdout", stderr or tmp / "stderr"
            for path in {out, err}:
                Path(path).write_bytes(b"")
            request = memoryview(json.dumps({
                "argv": [str(a) for a in argv], "env": dict(os.environ if env is None else env),
                "cwd": str(cwd or os.getcwd()), "stdin": str(tmp / "stdin"), "stdout": str(out),
                "stderr": str(err)}).encode() + b"\n")
            fd = self._started().stdin.fileno()
            while request:
                request = request[os.write(fd, request):]
            pid = int(self._line())
            code = self._line(timeout)
            timed_out = code is None
            if timed_out:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:  # it ended as the timeout came
                    pass
                code = self._line()
            code = int(code)
            captured = [None if stdout else out.read_text(errors="replace"),
                        None if stderr else err.read_text(errors="replace")]
        if timed_out:
            raise subprocess.TimeoutExpired(argv, timeout, *captured)
        return subprocess.CompletedProcess(argv, code, *captured)


_CLI = WarmProcess("from dflash_gguf.cli import main as run")
CLI_FILE = str(Path(__file__).resolve().parents[1] / "dflash_gguf" / "cli.py")


def run_cli(args, *, env: dict[str, str] | None = None, cwd: Path | str | None = None,
            timeout: float | None = None, input: str | None = None) -> subprocess.CompletedProcess:
    """`python -m dflash_gguf.cli ARGS` as subprocess.run(..., capture_output=True, text=True) answers it,
    in a child forked from a process that has imported the command line once."""
    return _CLI.run([CLI_FILE, *map(str, args)], env=env, cwd=cwd, timeout=timeout, input=input)
