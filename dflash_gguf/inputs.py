"""Opening input files: regular files only, read with a bound.

A FIFO, a socket or a device given as a model, config or prompts file would block the reader
forever or never end; they are refused with one line before anything is read. Text inputs
(config.json, cards, prompts) are read up to a size no real one reaches.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from .errors import InputError

TEXT_LIMIT = 64 << 20  # bytes: far above any config.json, tokenizer.json or model card


def open_regular(path: Path | str, what: str = "file") -> BinaryIO:
    """`path` opened for binary reading, after checking it is a regular file (never blocks)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"{path}: no such {what}") from None
    except OSError as err:
        raise InputError(f"{path}: cannot open this {what} ({err.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file (a FIFO, socket or device)"
        raise InputError(f"{path}: this {what} is {kind}; give a regular file")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bytes(path: Path | str, what: str = "file", limit: int = TEXT_LIMIT) -> bytes:
    with open_regular(path, what) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"{path}: this {what} is over {limit >> 20} MiB; that is not one")
    return data


def read_text(path: Path | str, what: str = "file", limit: int = TEXT_LIMIT) -> str:
    try:
        return read_bytes(path, what, limit).decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: this {what} is not UTF-8 text (byte {err.start})") from None


def parse_json(data: bytes | str, source: str):
    """JSON text as Python values; InputError (naming `source`) when it is not JSON or nests too deeply."""
    import json

    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{source}: not valid JSON ({err})") from None
    except RecursionError:
        raise InputError(f"{source}: JSON nested too deeply to be a model file") from None


def load_json(path: Path | str, what: str = "file"):
    return parse_json(read_bytes(path, what), str(path))
