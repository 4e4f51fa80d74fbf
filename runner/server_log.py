"""llama-server's log file as `--log FILE` keeps it: each run's log starts with this header, so a later
run replaces a log it wrote earlier and never a file that is not one."""

from __future__ import annotations

from pathlib import Path

from dflash_gguf.outputs import head

HEADER = b"# llama-server log kept by dflash-gguf (--log); the next run with this --log replaces it\n"


def is_server_log(path: Path) -> bool:
    return head(path, len(HEADER)) == HEADER
