"""Folder outputs (a release, a trained drafter): built beside, put in place whole, and replaced only
where the toolkit wrote every file.

    with built_beside(out_dir, force=force, command="release") as tmp:
        ... write the files into tmp ...

What "wrote it" means: a folder this module puts in place carries `.dflash-gguf-manifest.json`,
written last, naming the command and each file with its size and sha256. `--force` replaces a folder
only when every entry in it is a regular file its manifest lists with those bytes; anything else (a
user's README.md or LICENSE, a `dflash-*.gguf` of their own, a file edited since, a subfolder, a
link, a manifest of another command) is refused, named, and left alone. A folder with no manifest
(made by hand, or by a version before manifests) is taken only when empty.

Nothing is removed through a link: the earlier folder is renamed aside into a hidden holder, opened
with O_NOFOLLOW (a link swapped in is put back and refused), checked again through that descriptor
and emptied through it, file by file, of exactly the files checked. The renames that set aside,
put in place and put back run with SIGINT, SIGTERM and SIGHUP held until they end, so no exit leaves
a `.NAME.*.old` or `.NAME.*.partial` folder beside the output.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__
from .confined_reader import Opened
from .errors import InputError, OutputError
from .hashing import sha256_file
from .inputs import parse_json
from .outputs import guard, named_for, rename_exclusive
from .secrets import scrub
from .terminal import shown

log = logging.getLogger(__name__)

MANIFEST = ".dflash-gguf-manifest.json"
_MANIFEST_LIMIT = 4 << 20  # bytes: a few hundred files' names and hashes take a few kB
_FORMAT = 1
_SHA256 = re.compile(r"[0-9a-f]{64}")
_COMMAND = re.compile(r"[a-z][a-z-]{0,31}")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_RACED = {errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR}  # something took the place


# --- what a folder holds ------------------------------------------------------------------------

@dataclass
class _Survey:
    owned: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (dev, ino) as checked
    foreign: list[str] = field(default_factory=list)                  # how each other entry is named
    why: str | None = None  # set when no usable manifest says what was written: nothing is owned

    @property
    def empty(self) -> bool:
        return not self.owned and not self.foreign


def _manifest_files(fd: int, command: str) -> tuple[dict | None, str | None]:
    """The manifest's {name: {"bytes", "sha256"}} for `command`, or (None, why it cannot be trusted)."""
    try:
        mfd = os.open(MANIFEST, _FILE_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        return None, (f"no {MANIFEST} records what an earlier run wrote there (a folder made by hand, or by a "
                      "dflash-gguf older than these records)")
    except OSError:
        return None, f"its {MANIFEST} is not a regular file"
    with os.fdopen(mfd, "rb") as fh:
        st = os.fstat(fh.fileno())
        data = fh.read(_MANIFEST_LIMIT + 1) if stat.S_ISREG(st.st_mode) else b""
    unusable = f"its {MANIFEST} is not one dflash-gguf wrote"
    if not data or len(data) > _MANIFEST_LIMIT:
        return None, unusable
    try:
        doc = parse_json(data, MANIFEST)
    except InputError:
        return None, unusable
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict) or doc.get("format") != _FORMAT or not isinstance(doc.get("command"), str) \
            or not _COMMAND.fullmatch(doc["command"]):
        return None, unusable
    for record in files.values():
        if not (isinstance(record, dict) and isinstance(record.get("sha256"), str)
                and _SHA256.fullmatch(record["sha256"]) and type(record.get("bytes")) is int and record["bytes"] >= 0):
            return None, unusable
    if doc["command"] != command:
        return None, f"its {MANIFEST} records the output of `dflash-gguf {doc['command']}`, not of `{command}`"
    return files, None


def _sha256_at(fd: int, name: str) -> str | None:
    """The sha256 of the regular file `name` in the folder open as `fd` (never through a link)."""
    try:
        ffd = os.open(name, _FILE_FLAGS, dir_fd=fd)
    except OSError:
        return None
    opened = Opened(Path(name), Path(name), ffd)
    try:
        return opened.sha256() if stat.S_ISREG(os.fstat(ffd).st_mode) else None
    finally:
        opened.close()


def _entry(fd: int, name: str, record: dict | None) -> str | None:
    """None when `name` is a file the manifest lists with these bytes; else how to name it in a refusal."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return f"{name}/"
    if stat.S_ISLNK(st.st_mode):
        return f"{name} (a link)"
    if not stat.S_ISREG(st.st_mode):
        return f"{name} (not a regular file)"
    if record is None:
        return name
    if st.st_size != record["bytes"] or _sha256_at(fd, name) != record["sha256"]:
        return f"{name} (changed since it was written)"
    return None


def _survey(fd: int, command: str) -> _Survey:
    """What the folder open as `fd` holds: the files `command` wrote there, unchanged, and the rest."""
    names = sorted(os.listdir(fd))
    if not names:
        return _Survey()
    files, why = _manifest_files(fd, command)
    if files is None:
        return _Survey(foreign=[_entry(fd, n, None) or n for n in names], why=why)
    survey = _Survey()
    for name in names:
        problem = None if name == MANIFEST else _entry(fd, name, files.get(name))
        if problem is not None:
            survey.foreign.append(problem)
            continue
        with suppress(FileNotFoundError):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            survey.owned[name] = (st.st_dev, st.st_ino)
    return survey


def _refusal(out_dir: Path, option: str, command: str, survey: _Survey) -> OutputError:
    shown_names = [shown(n) for n in survey.foreign]
    listed = ", ".join(shown_names[:3]) + (f" and {len(shown_names) - 3} more" if len(shown_names) > 3 else "")
    if survey.why is not None:
        return OutputError(f"{option} {shown(out_dir)}: holds {listed}, which `dflash-gguf {command}` did not write "
                           f"as far as it can tell: {survey.why}; nothing was removed: empty or remove the folder "
                           f"yourself, or pick another {option}")
    return OutputError(f"{option} {shown(out_dir)}: holds {listed}, which `dflash-gguf {command}` did not write; "
                       f"--force replaces only the files an earlier run recorded in its {MANIFEST}: move them out "
                       f"of the folder, or pick another {option}")


def _open_folder(path: Path) -> int:
    """`path` opened as a folder, never through a link (OSError when it is a link or not a folder)."""
    return os.open(path, _DIR_FLAGS)


def check_destination(out_dir: Path | str, force: bool, command: str, option: str = "-o") -> list[str] | None:
    """Refuse an `out_dir` the folder output may not be put at (OutputError, one line); else what is
    there: None (nothing), [] (an empty folder, taken as it is), or the names of an earlier output of
    `command`, which only --force replaces."""
    out_dir = Path(out_dir)
    if not out_dir.parent.is_dir():
        raise OutputError(f"{option} {shown(out_dir)}: the folder {shown(out_dir.parent)} does not exist")
    try:
        st = os.lstat(out_dir)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise OutputError(f"{option} {shown(out_dir)}: is a link; nothing is written or removed through a link: "
                          f"give the folder itself, or another {option}")
    if not stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{option} {shown(out_dir)}: exists and is not a folder; give a new folder name")
    try:
        fd = _open_folder(out_dir)
    except OSError as err:
        raise OutputError(f"{option} {shown(out_dir)}: cannot open this folder ({err.strerror})") from None
    try:
        survey = _survey(fd, command)
    finally:
        os.close(fd)
    if survey.empty:
        return []
    if survey.foreign:
        raise _refusal(out_dir, option, command, survey)
    if not force:
        raise OutputError(f"{option} {shown(out_dir)}: already holds an earlier `dflash-gguf {command}` output; "
                          "pass --force to replace it")
    return sorted(survey.owned)


# --- writing ------------------------------------------------------------------------------------

def _write_manifest(folder: Path, command: str) -> None:
    """The record of what `folder` holds, written last: every regular file with its size and sha256."""
    files = {}
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name != MANIFEST and entry.is_file(follow_symlinks=False):
            files[entry.name] = {"bytes": entry.stat(follow_symlinks=False).st_size, "sha256": sha256_file(entry.path)}
    doc = {"format": _FORMAT, "written_by": f"dflash-gguf {__version__}", "command": command, "files": files}
    with open(folder / MANIFEST, "x", encoding="utf-8") as fh:
        fh.write(scrub(json.dumps(doc, indent=1, sort_keys=True)) + "\n")


@contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP wait until the block ends, then act as they would have: a rename that
    sets a folder aside and the one that puts it back are never separated by an exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = {}
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None and signal.getsignal(sig) is not None:
            previous[sig] = signal.signal(sig, lambda signum, _frame: got.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(got):
            signal.raise_signal(sig)


class _Aside:
    """An earlier output, renamed into a new hidden holder beside it (`.NAME.*.old/previous`), opened
    without following links and checked there, until it is removed (`discard`) or put back (`restore`)."""

    def __init__(self, out_dir: Path, command: str, option: str):
        self.out_dir, self.command, self.option = out_dir, command, option
        self.fd: int | None = None
        self.pending = False  # set aside, neither removed nor put back yet
        try:
            with _signals_held():  # a signal held here acts as the block ends: put back below
                self.holder = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".old"))
                self.path = self.holder / "previous"
                try:
                    os.rename(out_dir, self.path)
                except BaseException:
                    self.holder.rmdir()
                    raise
                self.pending = True
            self.survey = self._check()
        except BaseException:
            if self.pending:
                self.restore()
            raise

    def _check(self) -> _Survey:
        try:
            self.fd = _open_folder(self.path)
        except OSError:
            raise OutputError(f"{self.option} {shown(self.out_dir)}: became a link, or something other than a folder, "
                              f"while the {self.command} ran; it was left as it is, nothing in it removed, and this "
                              f"{self.command} not written: run again, or pick another {self.option}") from None
        survey = _survey(self.fd, self.command)
        if survey.foreign:
            raise _refusal(self.out_dir, self.option, self.command, survey)
        return survey

    def restore(self) -> Path | None:
        """Put the earlier output back at its place; where that is taken meanwhile, where it is kept."""
        with _signals_held():
            self.pending = False
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None
            try:
                rename_exclusive(self.path, self.out_dir)
            except OSError:
                return self.path
            self.holder.rmdir()
            return None

    def discard(self) -> None:
        """Remove, through the open folder, exactly the files checked (each still the one checked), then
        the folder and its holder; anything put in it meanwhile is kept, with a warning naming it."""
        with _signals_held():
            self.pending = False
            for name, ident in self.survey.owned.items():
                with suppress(FileNotFoundError):
                    st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
                    if (st.st_dev, st.st_ino) == ident and stat.S_ISREG(st.st_mode):
                        os.unlink(name, dir_fd=self.fd)
            os.close(self.fd)
            self.fd = None
            try:
                os.rmdir(self.path)
                os.rmdir(self.holder)
            except OSError:
                log.warning("%s: kept, as something was put in it while the %s ran; remove it yourself",
                            shown(self.path), self.command)


def _move_into_place(tmp: Path, out_dir: Path, present: list[str] | None, command: str, option: str) -> None:
    """Put the finished folder at `out_dir` by one rename that replaces nothing but what was checked:
    nothing (a folder that appeared meanwhile is refused), the empty folder that was there (refused once
    something is put in it), or, with --force, the earlier output, set aside and checked again first,
    and removed only once the new one is in place."""
    aside = _Aside(out_dir, command, option) if present else None
    try:
        with _signals_held():
            try:
                if present == []:
                    os.rename(tmp, out_dir)  # onto the empty folder that was checked: fails once it is not empty
                else:
                    rename_exclusive(tmp, out_dir)
            except OSError as err:
                kept = aside.restore() if aside is not None else None
                if err.errno in _RACED:
                    where = f"; the earlier output is kept at {shown(kept)}" if kept is not None else ""
                    raise OutputError(f"{option} {shown(out_dir)}: something was put there while the {command} ran; "
                                      f"it was left as it is and this {command} not written{where}: run again, or "
                                      f"pick another {option}") from None
                raise
            if aside is not None:
                aside.discard()
    except BaseException:
        if aside is not None and aside.pending:
            aside.restore()
        raise


@contextmanager
def _claimed(out_dir: Path, command: str, option: str) -> Iterator[None]:
    """A lock file beside `out_dir` (`.NAME.lock`, made with O_EXCL) while an output is built for it: a
    second run writing the same folder is refused at once; the file is removed at exit, by its maker."""
    lock = out_dir.with_name(f".{out_dir.name}.lock")
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        raise OutputError(f"{option} {shown(out_dir)}: another `dflash-gguf {command}` is writing this folder "
                          f"({shown(lock)} exists{_holder(lock)}); wait for it to end, or remove {shown(lock)} if "
                          "none is running") from None
    except OSError as err:
        raise named_for(err, out_dir) from None
    mine = os.fstat(fd)
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)
        with suppress(OSError):
            now = os.lstat(lock)
            if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                os.unlink(lock)


def _holder(lock: Path) -> str:
    """", held by process N" (or "left by process N, which has ended"), from the lock file's content."""
    try:
        pid = int(lock.read_bytes()[:16].decode("ascii").strip())
        os.kill(pid, 0)
    except ProcessLookupError:
        return f", left by process {pid}, which has ended"
    except (OSError, ValueError):
        return ""
    return f", held by process {pid}"


@contextmanager
def built_beside(out_dir: Path | str, *, force: bool, command: str, option: str = "-o") -> Iterator[Path]:
    """A new hidden folder beside `out_dir` to build the output in, while `out_dir` is claimed (a lock
    file): when the block completes, its manifest is written and it is put in place (`_move_into_place`);
    when the block raises, it is removed (an OSError about it names `out_dir`). Nothing is removed that
    the checks did not find to be an earlier output of `command`."""
    out_dir = Path(os.path.abspath(out_dir))
    with _claimed(out_dir, command, option):
        present = check_destination(out_dir, force, command, option)  # again, now that no other run changes it
        tmp: Path | None = None
        try:
            tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".partial"))
            yield tmp
            _write_manifest(tmp, command)
            guard(out_dir, option, folder=True)
            _move_into_place(tmp, out_dir, present, command, option)
        except BaseException as err:
            if tmp is not None:
                with _signals_held():
                    shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(err, OSError) and (err.filename is None or tmp is None
                                             or str(err.filename).startswith(str(tmp))):
                raise named_for(err, out_dir) from None
            raise
