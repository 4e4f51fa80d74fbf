"""File digests: one sha256 routine for sources, variants, downloads and patches."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def sha256_file(path: Path | str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def hash_files(folder: Path | str, files: list) -> dict[str, str]:
    """Each file's sha256, by its path relative to `folder`. A file opened by the confined reader
    (confine.Opened) is hashed from its open file: the bytes read, not what the name holds now."""
    folder = Path(folder)
    out = {}
    for item in files:
        path = Path(getattr(item, "path", item))
        key = path.relative_to(folder).as_posix() if path.is_relative_to(folder) else path.name
        out[key] = item.sha256() if hasattr(item, "sha256") else sha256_file(path)
    return out


def same_file(a: Path | str, b: Path | str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
