"""What a command may write: checked once, before any work starts, by every command that writes.

    check_outputs([Output(out, "-o")], [Input(src, "SRC"), Input(target, "--target")], force=force)

The rules, the same for every command:

- an output is never one of the command's inputs, with or without --force: the same path after
  resolving links, or the same file under another name (a hard link: same device and inode);
- an output file is never an existing file inside an input folder (a checkpoint's config.json or
  shards, a target folder's tokenizer); only GGUF files there, which no folder reader reads, may
  be replaced;
- an output folder is never an input folder, nor a folder holding an input;
- an existing output that is not a regular file (a folder where a file is wanted, a FIFO, a
  device) is refused;
- an output is never a file the command has read (inputs.py records each one, by resolved path and
  by device and inode), wherever it was found: a shard an index named, a tokenizer file, a card;
  checked before work starts and again just before the output is put in place (`guard`);
- an existing file is replaced only with --force (`Replace.FORCE`), or, for reports and logs
  (`Replace.OWNED`), only when it is empty or one this command wrote earlier (`owned(path)` says
  so): a report never silently replaces a file that is not a report;
- a folder output (a release, a trained drafter) is built and replaced only through owned_folder.py:
  --force replaces a folder only where its manifest shows the command wrote every file in it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Callable, Iterable, Iterator

from .errors import OutputError
from .inputs import read_by, read_paths_under
from .secrets import scrub
from .terminal import shown

# How deep, and how many entries, an input folder is walked for the files it holds (a checkpoint keeps
# its config in a subfolder at most); a folder beyond that is still protected as a whole.
_FOLDER_DEPTH = 2
_FOLDER_ENTRIES = 10_000


class Replace(Enum):
    FORCE = "force"   # an existing file is replaced with --force
    OWNED = "owned"   # an existing file is replaced only when `owned(path)` recognises it


@dataclass(frozen=True)
class Input:
    path: Path | str | None
    option: str  # how the user named it: "SRC", "--target", "--draft"


@dataclass(frozen=True)
class Output:
    path: Path | str
    option: str                                    # "-o", "--json", "--log", "OUT.gguf"
    replace: Replace = Replace.FORCE
    owned: Callable[[Path], bool] | None = None   # for Replace.OWNED: was this file written by us?
    what: str = "file"                             # "file", "report", "log": for messages
    folder: bool = False                           # the output is a folder (release)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _inside(path: Path, folder: Path) -> bool:
    try:
        return os.path.commonpath([path, folder]) == str(folder)
    except ValueError:
        return False


def _walk(folder: Path) -> Iterator[Path]:
    """The files an input folder holds (bounded; links are followed only as the readers would)."""
    seen = 0
    stack = [(folder, 0)]
    while stack:
        current, depth = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > _FOLDER_ENTRIES:
                return
            path = Path(entry.path)
            try:
                if entry.is_dir():
                    if depth < _FOLDER_DEPTH:
                        stack.append((path, depth + 1))
                else:
                    yield path
            except OSError:
                continue


def _protected_files(folder: Path) -> Iterator[Path]:
    for path in _walk(folder):
        if path.suffix.lower() != ".gguf":
            yield path


def _clash(out: Output, inputs: list[Input]) -> str | None:
    """Why `out` would overwrite an input, or None."""
    path = Path(out.path)
    real = Path(os.path.realpath(path))
    ident = _identity(path)
    for given in inputs:
        src = Path(given.path)
        src_real = Path(os.path.realpath(src))
        named = f"the input {given.option} {src}"
        if real == src_real or (ident is not None and ident == _identity(src)):
            return f"is {named}"
        if src_real.is_dir():
            if out.folder:
                if _inside(src_real, real):
                    return f"holds {named}"
                continue
            if ident is not None and not real.is_dir() and _inside(real, src_real) \
                    and real.suffix.lower() != ".gguf":
                return f"is a file of {named}"
            if ident is not None:
                for held in _protected_files(src_real):
                    if _identity(held) == ident:
                        return f"is {held} of {named}"
        elif out.folder and _inside(src_real, real):
            return f"holds {named}"
    return None


def check_outputs(outputs: Iterable[Output], inputs: Iterable[Input], *, force: bool = False) -> None:
    """Raise OutputError (one line naming the output and why) unless every output may be written."""
    # a model named on the Hub (dflash_gguf/hub/resolve.py HubRef) is no local path an output could replace
    inputs = [i for i in inputs if isinstance(i.path, (str, os.PathLike)) and os.path.lexists(i.path)]
    outputs = list(outputs)
    for out in outputs:
        path = Path(out.path)
        guard(path, out.option, folder=out.folder)
        why = _clash(out, inputs)
        if why:
            raise OutputError(f"{out.option} {path}: {why}; an output never replaces an input, "
                              "--force or not: write it elsewhere")
        if not path.parent.is_dir() and str(path.parent) not in ("", "."):
            raise OutputError(f"{out.option} {path}: the folder {path.parent} does not exist")
        if not os.path.lexists(path):
            continue
        try:
            st = os.stat(path)
        except OSError:
            raise OutputError(f"{out.option} {path}: a link to nothing; remove it or give another name") from None
        if out.folder:
            if not stat.S_ISDIR(st.st_mode):
                raise OutputError(f"{out.option} {path}: exists and is not a folder")
            continue
        if stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{out.option} {path}: is a folder; give a file name, e.g. {path / 'out.gguf'}"
                              if out.what == "file" else f"{out.option} {path}: is a folder; give a file name")
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{out.option} {path}: is not a regular file (a FIFO, socket or device); "
                              "give a file name")
        if out.replace is Replace.FORCE and not force:
            raise OutputError(f"{out.option} {path}: already exists; pass --force to replace it")
        if out.replace is Replace.OWNED and st.st_size and not (out.owned and out.owned(path)):
            raise OutputError(f"{out.option} {path}: already exists and is not a {out.what} this command "
                              f"wrote; give a new file name or remove it first")
    seen: dict[str, str] = {}
    for out in outputs:
        real = os.path.realpath(out.path)
        if real in seen:
            raise OutputError(f"{out.option} {out.path}: is also {seen[real]}; give each output its own name")
        seen[real] = out.option


def guard(out: Path | str, option: str = "output", folder: bool = False) -> None:
    """Refuse to put `out` in place when it is a file this command read (or, for a folder, holds one)."""
    held = read_by(out)
    if held is None and folder:
        held = next(iter(read_paths_under(out)), None)
    if held is not None:
        what = "holds" if folder and os.path.realpath(out) != held else "is"
        raise OutputError(f"{option} {shown(out)}: {what} {shown(held)}, a file this command reads; an output never "
                          "replaces an input, --force or not: write it elsewhere")


def head(path: Path, n: int = 4096) -> bytes:
    """The first bytes of a regular file (b"" for anything else): what `owned` predicates look at."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return b""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return b""
        return os.read(fd, min(n, st.st_size + 1))  # +1: a file that grew since is still seen as longer
    finally:
        os.close(fd)


def named_for(err: OSError, out: Path | str) -> OSError:
    """An OSError met on a hidden temporary file, told about the user's output instead."""
    return OSError(err.errno, err.strerror or str(err), str(out))


def partial_name(out: Path | str) -> Path:
    """The hidden temporary file an output is written to before it is renamed into place."""
    out = Path(out)
    return out.with_name(f".{out.name}.{os.getpid()}.partial")


def write_text(out: Path | str, text: str) -> None:
    """Write a small text output (a report) whole or not at all: a temporary file renamed into place;
    no token in it (secrets.scrub)."""
    out = Path(out)
    tmp = partial_name(out)
    try:
        guard(out)
        tmp.write_text(scrub(text), encoding="utf-8")
        os.replace(tmp, out)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise named_for(err, out) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


_RENAME_NOREPLACE = 1  # linux/fs.h
_AT_FDCWD = -100


def _renameat2():
    try:
        return ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None


def rename_exclusive(src: Path | str, dst: Path | str) -> None:
    """Rename `src` to `dst` only when nothing is at `dst`, in one step: FileExistsError (EEXIST) when
    anything, even an empty folder, is there by then. Linux's renameat2(RENAME_NOREPLACE); where that
    is missing, `dst` is made as an empty folder first (mkdir fails when it exists) and `src` renamed
    onto it, which fails when anything was put in it meanwhile."""
    renameat2 = _renameat2()
    if renameat2 is not None:
        if renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.ENOSYS, errno.EINVAL):  # EINVAL: a file system without the flag
            raise OSError(code, os.strerror(code), str(dst))
    if not os.path.isdir(src):
        os.link(src, dst)  # a file: a hard link fails when dst exists
        os.unlink(src)
        return
    os.mkdir(dst)
    try:
        os.rename(src, dst)
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(dst)  # ours, and still empty; a folder someone filled meanwhile stays
        raise
