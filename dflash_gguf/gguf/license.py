"""A GGUF's license: `general.license` (with `general.license.name` / `.link` for `other`), read
through the typed general.* metadata and judged by the one license parser (dflash_gguf/licenses.py)."""

from __future__ import annotations

from ..licenses import License, license_ids, strictest
from .keys import General
from .reader import GGUFFile


def license_from_gguf(path, opened=None) -> License:
    """`general.license` (with `general.license.name` / `.link` for `other`) of a GGUF; the strictest
    when it names several. `opened`: the file already open as a GGUFFile, or its metadata as a dict
    (saves parsing it again)."""

    f = opened if opened is not None else GGUFFile(path)
    try:
        general = f if isinstance(f, dict) else f.general()  # typed text values
        value, name, link = general.get(General.LICENSE), general.get(General.LICENSE_NAME), general.get(General.LICENSE_LINK)
        repo = general.get(General.REPO_URL)
    finally:
        if opened is None:
            f.close()
    name = str(name) if name is not None else None
    link = str(link) if link is not None else None
    repo = str(repo) if repo is not None else None
    source = f"{path} {General.LICENSE}"
    found = [License(i, source, name, link, None, repo) for i in license_ids(value)]
    return strictest(found) if found else License(None, source, name, link, None, repo)
