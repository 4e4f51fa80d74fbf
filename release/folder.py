"""The release folder: where it may go, and built beside it so that it appears whole or not at all.

One release at a time per folder (a lock file beside it), and nothing removed that this run did not make
but, with --force, the files of the earlier release it replaces.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from ..errors import ReleaseError
from ..gguf import layout
from ..outputs import guard, named_for, rename_exclusive
from ..licenses import LICENSE_FILE_NAMES
from . import license_rules as lic
from .license_files import target_name

log = logging.getLogger(__name__)


def is_release_file(name: str) -> bool:
    """A file name `release` writes: what --force may replace."""
    licenses = set(LICENSE_FILE_NAMES) | {target_name(n) for n in LICENSE_FILE_NAMES}
    return (name in {"README.md", "NOTICE", lic.COMBINED_LICENSE_FILE} or name in licenses
            or layout.is_drafter_file(name))


def check_destination(out_dir: Path, force: bool) -> list[str] | None:
    """Refuse an `out_dir` a release may not be put at; what it holds (None: nothing is there; [] an empty
    folder, taken as it is; else an earlier release, replaced with --force)."""
    if not out_dir.parent.is_dir():
        raise ReleaseError(f"{out_dir.parent}: folder does not exist")
    if not os.path.lexists(out_dir):
        return None
    if out_dir.is_symlink() or not out_dir.is_dir():
        raise ReleaseError(f"{out_dir}: exists and is not a folder")
    present = sorted(p.name for p in out_dir.iterdir())
    if present and not force:
        raise ReleaseError(f"{out_dir}: already exists; pass --force to replace it")
    _refuse_foreign(out_dir, present)
    return present


def _refuse_foreign(folder: Path, present: list[str], shown_as: Path | None = None) -> None:
    foreign = [n for n in present if not is_release_file(n) or not stat.S_ISREG(os.lstat(folder / n).st_mode)]
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise ReleaseError(f"{shown_as or folder}: holds {', '.join(foreign[:3])}{more}, which a release does not "
                           "write; --force only replaces an earlier release folder")


@contextmanager
def _claimed(out_dir: Path) -> Iterator[None]:
    """A lock file beside `out_dir` (`.NAME.lock`, made with O_EXCL) while a release is built for it: a
    second release to the same folder is refused at once; the file is removed at exit, by its maker."""
    lock = out_dir.with_name(f".{out_dir.name}.lock")
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    except FileExistsError:
        raise ReleaseError(f"-o {out_dir}: another release is writing this folder ({lock} exists{_holder(lock)}); "
                           f"wait for it to end, or remove {lock} if no release is running") from None
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


def _move_into_place(tmp: Path, out_dir: Path, present: list[str] | None) -> None:
    """Put the finished folder at `out_dir` in one atomic rename that never replaces anything but what
    was checked: nothing (a folder that appeared meanwhile is refused), the empty folder that was there
    (refused once something is put in it), or, with --force, the earlier release, set aside first and
    removed file by file only once the new one is in place."""
    aside = _set_aside(out_dir) if present else None
    try:
        if present == []:
            os.rename(tmp, out_dir)  # onto the empty folder that was checked: fails once it is not empty
        else:
            rename_exclusive(tmp, out_dir)
    except OSError as err:
        if aside is not None:
            with suppress(OSError):
                rename_exclusive(aside, out_dir)
        if err.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
            kept = f"; the earlier release is kept at {aside}" if aside is not None and aside.exists() else ""
            raise ReleaseError(f"-o {out_dir}: something was put there while the release was built; it was left as "
                               f"it is and this release not written{kept}: run again, or choose another folder") \
                from None
        raise
    if aside is not None:
        _remove_earlier_release(aside)


def _set_aside(out_dir: Path) -> Path:
    """Move the earlier release at `out_dir` into a new hidden folder beside it, checked again there."""
    holder = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".old"))
    aside = holder / "release"
    os.rename(out_dir, aside)
    try:
        _refuse_foreign(aside, sorted(p.name for p in aside.iterdir()), shown_as=out_dir)
    except ReleaseError:
        rename_exclusive(aside, out_dir)
        holder.rmdir()
        raise
    return aside


def _remove_earlier_release(aside: Path) -> None:
    """Remove the files a release writes from the set-aside folder, then the folder: anything else found
    there is left, with a warning naming it."""
    for entry in os.scandir(aside):
        if is_release_file(entry.name) and entry.is_file(follow_symlinks=False):
            os.unlink(entry.path)
    try:
        aside.rmdir()
        aside.parent.rmdir()
    except OSError:
        log.warning("%s: kept, as it holds files a release does not write; remove it yourself", aside)


@contextmanager
def built_beside(out_dir: Path, force: bool = False) -> Iterator[Path]:
    """A new temporary folder beside `out_dir` to build the release in, while `out_dir` is claimed (a lock
    file): renamed onto `out_dir` when the block completes (see _move_into_place), removed when it raises
    (an OSError about the temporary folder names `out_dir`). Nothing this run did not make is removed."""
    with _claimed(out_dir):
        present = check_destination(out_dir, force)  # again, now that no other release can change it
        try:
            tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".partial"))
        except OSError as err:
            raise named_for(err, out_dir) from None
        try:
            yield tmp
            guard(out_dir, "-o", folder=True)
            _move_into_place(tmp, out_dir, present)
        except OSError as err:
            shutil.rmtree(tmp, ignore_errors=True)
            if err.filename is None or str(err.filename).startswith(str(tmp)):
                raise named_for(err, out_dir) from None
            raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
