"""Opening input files: regular files only, read with a bound, and every file read remembered.

A FIFO, a socket or a device given as a model, config or prompts file would block the reader
forever or never end; they are refused with one line before anything is read. Text inputs
(config.json, cards, prompts) are read up to a size no real one reaches, and refused before a
byte is read when larger (a 6 GiB sparse tokenizer.json costs nothing to refuse).

Every file opened here or by the confined reader (confined_reader.py) is recorded for the command that
runs (`reading()`, which the command line enters), so that outputs.py can refuse an output that
is a file read, by path after resolving links or by device and inode, wherever it was found.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import stat
from pathlib import Path
from typing import BinaryIO, Iterator

from .errors import InputError
from .terminal import shown

__all__ = ["TEXT_LIMIT", "open_regular", "read_bytes", "read_text", "decode_text", "parse_json", "load_json",
           "record", "read_by", "read_paths_under", "reading", "shown"]

TEXT_LIMIT = 64 << 20  # bytes: far above any config.json, tokenizer.json or model card
MAX_INT_DIGITS = 40    # digits of a JSON integer: far beyond any u64 or i64 a model file holds

# (device, inode) -> the resolved path, and resolved path -> the same, of every file read
_read_ids: dict[tuple[int, int], str] = {}
_read_paths: set[str] = set()
_held: list[object] = []  # confined files opened during a command (`reading()`), closed when it ends
_sessions = 0


def record(real: Path | str, ident: tuple[int, int], held: object | None = None) -> None:
    """Remember a file read by the command that runs (nothing outside `reading()`: a library caller's
    files close with their objects, and no record outlives the command)."""
    if not _sessions:
        return
    _read_ids[ident] = str(real)
    _read_paths.add(str(real))
    if held is not None:
        _held.append(held)


def read_by(path: Path | str) -> str | None:
    """The input file `path` would replace (resolved path or same device and inode), or None."""
    real = os.path.realpath(path)
    if real in _read_paths:
        return real
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _read_ids.get((st.st_dev, st.st_ino))


def read_paths_under(folder: Path | str) -> list[str]:
    """The files read that lie inside `folder` (after resolving links)."""
    root = os.path.realpath(folder)
    return sorted(p for p in _read_paths if p.startswith(root.rstrip("/") + "/"))


@contextlib.contextmanager
def reading() -> Iterator[None]:
    """A command's span: the record of files read starts empty and the files it held are closed."""
    global _sessions
    if _sessions:  # nested: the outer command's record stands
        yield
        return
    _read_ids.clear()
    _read_paths.clear()
    _sessions += 1
    try:
        yield
    finally:
        _sessions -= 1
        for held in _held:
            with contextlib.suppress(Exception):
                held.close()
        _held.clear()
        _read_ids.clear()
        _read_paths.clear()


def open_regular(path: Path | str, what: str = "file") -> BinaryIO:
    """`path` opened for binary reading, after checking it is a regular file (never blocks)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"{shown(path)}: no such {what}") from None
    except OSError as err:
        raise InputError(f"{shown(path)}: cannot open this {what} ({err.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, socket or device)"
        raise InputError(f"{shown(path)}: this {what} is {kind}; give a regular file")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    record(os.path.realpath(path), (st.st_dev, st.st_ino))
    return os.fdopen(fd, "rb")


def read_bytes(path: Path | str, what: str = "file", limit: int = TEXT_LIMIT) -> bytes:
    with open_regular(path, what) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise InputError(f"{shown(path)}: this {what} is {size} bytes, over {limit >> 20} MiB; that is not one")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"{shown(path)}: this {what} is over {limit >> 20} MiB; that is not one")
    return data


def decode_text(data: bytes, source: object, what: str = "file", truncated: bool = False) -> str:
    """The text of a file the tools read (a card, a license, a config, a tokenizer file, a template):
    strict UTF-8 (a leading UTF-8 BOM dropped), else InputError naming `source`. Never decoded with
    replacement: a UTF-16 card would read as one without front matter, hiding its license.
    `truncated`: `data` is the head of a longer file, so a character cut at its end is not an error."""
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(data, final=not truncated)
    except UnicodeDecodeError as err:
        bad = err.start
    else:
        # a NUL byte is UTF-16 (or binary), never text a model file holds
        bad = data.find(b"\0") if "\0" in text else -1
        if bad < 0:
            return text.removeprefix("\ufeff")
    kind = " (UTF-16)" if data[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE) else ""
    raise InputError(f"{shown(source)}: this {what} is not UTF-8 text{kind} (byte {bad}); save it as UTF-8")


def read_text(path: Path | str, what: str = "file", limit: int = TEXT_LIMIT) -> str:
    return decode_text(read_bytes(path, what, limit), path, what)


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits")
    return int(text)


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """An object's pairs as a dict; json.loads would keep the last of two equal keys silently, so
    the value a reader sees could differ from the one another tool (or a reviewer) sees."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


def parse_json(data: bytes | str, source: object):
    """JSON text as Python values; InputError (naming `source`) when it is not JSON, nests too
    deeply, repeats a key in an object, or holds an integer of more than MAX_INT_DIGITS digits (parsed
    before it is built)."""
    if isinstance(data, (bytes, bytearray)):
        # not json.loads(bytes), which would guess UTF-16 or UTF-32
        data = decode_text(bytes(data), source)
    try:
        return json.loads(data, parse_int=_bounded_int, object_pairs_hook=_unique_keys)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{shown(source)}: not valid JSON ({err})") from None
    except _DuplicateKey as err:
        raise InputError(f"{shown(source)}: key {shown(repr(err.args[0])[:80])} appears twice in one JSON object; "
                         "keep one of them") from None
    except ValueError as err:
        raise InputError(f"{shown(source)}: not valid JSON for a model file ({err}); fix the file") from None
    except RecursionError:
        raise InputError(f"{shown(source)}: JSON nested too deeply to be a model file") from None


def load_json(path: Path | str, what: str = "file"):
    return parse_json(read_bytes(path, what), str(path))
