"""Reading a model or release folder without leaving it.

A file reached through a symbolic link belongs to a folder only when the link resolves inside that
folder, or, for a Hugging Face cache snapshot (`models--org--name/snapshots/<rev>/`, whose files are
links to `../../blobs/<hash>`), inside the repository's cache folder. Anything else is refused with
one line naming the link and where it leads: nothing outside a folder is read into a release or
sent to the Hub.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import OutsideFolderError


def root_of(folder: Path | str) -> Path:
    """The folder whose inside a link of `folder` may lead to (the cache repo for a Hub snapshot)."""
    real = Path(os.path.realpath(folder))
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        return real.parent.parent
    return real


def is_inside(path: Path | str, folder: Path | str) -> bool:
    real, root = os.path.realpath(path), str(root_of(folder))
    try:
        return os.path.commonpath([real, root]) == root
    except ValueError:
        return False


def check_inside(path: Path | str, folder: Path | str, what: str = "file") -> Path:
    """`path`, after checking it does not lead out of `folder`; OutsideFolderError otherwise."""
    if not is_inside(path, folder):
        raise OutsideFolderError(
            f"{path}: this {what} is a link to {os.path.realpath(path)}, outside {folder}; nothing outside the "
            "folder is read into a release or an upload: copy the file into the folder or remove the link")
    return Path(path)


def file_in(folder: Path | str, name: str, what: str = "file") -> Path | None:
    """`folder/name` when it is a regular file inside the folder, None when absent; refuses escapes."""
    path = Path(folder) / name
    if not path.is_file():
        return None
    return check_inside(path, folder, what)
