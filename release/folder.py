"""The release folder: where it may go, and built beside it so that it appears whole or not at all."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..convert import layout
from ..errors import ReleaseError
from ..outputs import guard, named_for, partial_name
from . import licenses as lic
from .license_files import target_name


def is_release_file(name: str) -> bool:
    """A file name `release` writes: what --force may replace."""
    licenses = set(lic.LICENSE_FILE_NAMES) | {target_name(n) for n in lic.LICENSE_FILE_NAMES}
    return (name in {"README.md", "NOTICE", lic.COMBINED_LICENSE_FILE} or name in licenses
            or layout.is_drafter_file(name))


def check_destination(out_dir: Path, force: bool) -> None:
    if not out_dir.parent.is_dir():
        raise ReleaseError(f"{out_dir.parent}: folder does not exist")
    if out_dir.exists():
        if not out_dir.is_dir():
            raise ReleaseError(f"{out_dir}: exists and is not a folder")
        present = sorted(p.name for p in out_dir.iterdir())
        if present and not force:
            raise ReleaseError(f"{out_dir}: already exists; pass --force to replace it")
        foreign = [n for n in present if not is_release_file(n) or not (out_dir / n).is_file()]
        if foreign:
            more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
            raise ReleaseError(f"{out_dir}: holds {', '.join(foreign[:3])}{more}, which a release does not write; "
                               "--force only replaces an earlier release folder")


def _move_into_place(tmp: Path, out_dir: Path) -> None:
    """Put the finished folder at out_dir; a previous out_dir is removed only once the new one is in place."""
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.old")
        os.replace(out_dir, old)
    try:
        os.replace(tmp, out_dir)
    except BaseException:
        if old is not None:
            os.replace(old, out_dir)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def built_beside(out_dir: Path) -> Iterator[Path]:
    """A temporary folder beside `out_dir` to build the release in: renamed onto `out_dir` when the
    block completes, removed when it raises (an OSError about the temporary folder names `out_dir`)."""
    tmp = partial_name(out_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
    except OSError as err:
        raise named_for(err, out_dir) from None
    try:
        yield tmp
        guard(out_dir, "-o", folder=True)
        _move_into_place(tmp, out_dir)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if err.filename is None or str(err.filename).startswith(str(tmp)):
            raise named_for(err, out_dir) from None
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
