"""The release folder: where it may go (it is built beside it by outputs.built_beside, whole or not at all)."""

from __future__ import annotations

from pathlib import Path

from ..convert import layout
from ..errors import ReleaseError
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
