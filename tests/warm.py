"""`run_cli`: the command line run as a new process without paying for its imports each time, in a child
forked from a warm process that imported it once (training/fixtures/warm.py says what such a child shows
and what it does not: tests/base/test_cli.py keeps real subprocesses for those)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from training.fixtures.warm import WarmProcess


_CLI = WarmProcess("from dflash_gguf.cli import main as run")
CLI_FILE = str(Path(__file__).resolve().parents[1] / "dflash_gguf" / "cli.py")


def run_cli(args, *, env: dict[str, str] | None = None, cwd: Path | str | None = None,
            timeout: float | None = None, input: str | None = None) -> subprocess.CompletedProcess:
    """`python -m dflash_gguf.cli ARGS` as subprocess.run(..., capture_output=True, text=True) answers it,
    in a child forked from a process that has imported the command line once."""
    return _CLI.run([CLI_FILE, *map(str, args)], env=env, cwd=cwd, timeout=timeout, input=input)
