"""Reading a model or release folder without leaving it: the one confined reader.

Every file the tools read from a folder (a checkpoint's config, index, shards and mask embedding, a
target folder's config and tokenizer files, cards, license files, a release folder's files) is
opened here, once, and everything after (parsing, hashing, copying into a GGUF, a release or a
commit) uses that open file:

- its name is a plain relative name inside the folder (`safe_name`): no absolute path, no `..`, no
  backslash, no control character;
- after resolving links it lies inside the folder, or, for a Hugging Face cache snapshot
  (`models--org--name/snapshots/<rev>/`, whose files are links to `../../blobs/<hash>`), inside the
  repository's own `blobs/`; anything else is refused with one line naming the link and where it
  leads;
- it is opened component by component from the folder with O_NOFOLLOW, so a link swapped in after
  the check is refused rather than followed, and it must be a regular file (a FIFO never blocks);
- it is recorded (inputs.record) so that no output replaces a file that was read.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
from pathlib import Path
from typing import BinaryIO

from .errors import InputError, OutsideFolderError
from .inputs import TEXT_LIMIT, decode_text, record, shown

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _snapshot_repo(real_folder: Path) -> Path | None:
    """The cache repository folder of a Hub snapshot folder (already resolved), else None."""
    if real_folder.parent.name == "snapshots" and real_folder.parent.parent.name.startswith("models--"):
        return real_folder.parent.parent
    return None


def root_of(folder: Path | str) -> Path:
    """The folder whose inside a link of `folder` may lead to (the cache repo for a Hub snapshot)."""
    real = Path(os.path.realpath(folder))
    return _snapshot_repo(real) or real


def _within(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:
        return False


def _region(real: str, folder: Path | str) -> Path | None:
    """Where `real` (a resolved path) may be read from for `folder`: the folder itself, or the
    snapshot's repository `blobs/`; None when it lies outside both."""
    real_folder = Path(os.path.realpath(folder))
    if _within(real, str(real_folder)):
        return real_folder
    repo = _snapshot_repo(real_folder)
    if repo is not None and _within(real, str(repo / "blobs")):
        return repo / "blobs"
    return None


def is_inside(path: Path | str, folder: Path | str) -> bool:
    return _region(os.path.realpath(path), folder) is not None


def _outside(path: Path | str, folder: Path | str, what: str) -> OutsideFolderError:
    return OutsideFolderError(
        f"{shown(path)}: this {what} is a link to {shown(os.path.realpath(path))}, outside {shown(folder)}; nothing "
        "outside the folder is read into a GGUF, a release or an upload: copy the file into the folder or remove "
        "the link")


def check_inside(path: Path | str, folder: Path | str, what: str = "file") -> Path:
    """`path`, after checking it does not lead out of `folder`; OutsideFolderError otherwise."""
    if not is_inside(path, folder):
        raise _outside(path, folder, what)
    return Path(path)


def safe_name(name: object, source: object, field: str) -> str:
    """`name` when it names a file inside a folder (relative, POSIX, no `..`, no control characters);
    InputError naming `source` and `field` otherwise."""
    why = None
    if not isinstance(name, str) or not name:
        why = "is not a file name"
    elif any(ord(c) < 32 or ord(c) == 127 for c in name) or "\\" in name:
        why = "holds a control character or a backslash"
    elif name.startswith("/"):
        why = "is an absolute path"
    elif any(part in ("", ".", "..") for part in name.split("/")):
        why = "leaves the folder or has an empty component"
    if why:
        raise InputError(f"{shown(source)}: {field} {shown(repr(name)[:80])} {why}; give the name of a file inside "
                         "the folder")
    return name


class Opened:
    """A file of a folder, opened once: its open file (`fh`, `fileno()`), the name it was asked by
    (`path`, for messages), where it really is (`real`) and its size when opened."""

    def __init__(self, path: Path, real: Path, fd: int):
        self.path, self.real = Path(path), Path(real)
        st = os.fstat(fd)
        self.size, self.ident = st.st_size, (st.st_dev, st.st_ino)
        self.fh: BinaryIO = os.fdopen(fd, "rb")

    def __repr__(self) -> str:
        return f"Opened({str(self.path)!r})"

    @property
    def name(self) -> str:
        return self.path.name

    def fileno(self) -> int:
        return self.fh.fileno()

    def pread(self, n: int, offset: int) -> bytes:
        return os.pread(self.fileno(), n, offset)

    def within(self, limit: int, what: str = "file") -> "Opened":
        """This file, refused (and closed) when it is larger than `limit`: sized from what it holds, unread
        (a sparse 2 GiB LICENSE costs nothing to refuse)."""
        if self.size > limit:
            self.close()
            raise InputError(f"{shown(self.path)}: this {what} is {self.size} bytes, over the {limit >> 20} MiB a "
                             f"{what} may be; that is not one")
        return self

    def read(self, limit: int = TEXT_LIMIT, what: str = "file") -> bytes:
        """The whole file, refused before reading when it is larger than `limit`."""
        self.within(limit, what)
        data = self.pread(limit + 1, 0)
        if len(data) > limit:
            raise InputError(f"{shown(self.path)}: this {what} grew past {limit >> 20} MiB while being read")
        return data

    def text(self, limit: int = TEXT_LIMIT, what: str = "file") -> str:
        return decode_text(self.read(limit, what), self.path, what)

    def sha256(self) -> str:
        digest = hashlib.sha256()
        offset = 0
        while chunk := self.pread(16 << 20, offset):
            digest.update(chunk)
            offset += len(chunk)
        return digest.hexdigest()

    def rewound(self) -> BinaryIO:
        """The open file at its start (for readers that take a file object)."""
        self.fh.seek(0)
        return self.fh

    def copy_to(self, dst: Path | str) -> None:
        """Copy the opened file's bytes (not whatever the name holds now) to `dst`."""
        with open(dst, "wb") as out:
            shutil.copyfileobj(self.rewound(), out, 16 << 20)

    def close(self) -> None:
        self.fh.close()


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _open_below(root: Path, parts: tuple[str, ...], shown_path: Path, what: str) -> int:
    """Open root/parts... without following any link on the way; the open descriptor."""
    try:
        fd = os.open(root, _DIR_FLAGS & ~getattr(os, "O_NOFOLLOW", 0))
    except OSError as err:
        raise InputError(f"{shown(root)}: cannot open this folder ({err.strerror})") from None
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            try:
                nxt = os.open(part, _FILE_FLAGS if last else _DIR_FLAGS, dir_fd=fd)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.EMLINK, errno.ENOTDIR) and _is_link(part, fd):
                    raise OutsideFolderError(f"{shown(shown_path)}: this {what} became a link while it was read; "
                                             "nothing is read through a link swapped in") from None
                if err.errno == errno.ENOENT:
                    raise InputError(f"{shown(shown_path)}: no such {what}") from None
                raise InputError(f"{shown(shown_path)}: cannot open this {what} ({err.strerror})") from None
            os.close(fd)
            fd = nxt
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file (a FIFO, socket or device)"
            raise InputError(f"{shown(shown_path)}: this {what} is {kind}; give a regular file")
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_in(folder: Path | str, name: str, what: str = "file") -> Opened:
    """`folder/name` opened for reading, confined to the folder (see the module's docstring)."""
    opened = find_in(folder, name, what)
    if opened is None:
        raise InputError(f"{shown(Path(folder) / name)}: no such {what}")
    return opened


def find_in(folder: Path | str, name: str, what: str = "file") -> Opened | None:
    """As `open_in`, but None when nothing is there by that name (a dangling link is refused)."""
    safe_name(name, folder, what)
    path = Path(folder) / name
    if not os.path.lexists(path):
        return None
    real = os.path.realpath(path)
    root = _region(real, folder)
    if root is None:
        raise _outside(path, folder, what)
    if not os.path.exists(real):
        raise InputError(f"{shown(path)}: this {what} is a link to nothing; remove it or restore its target")
    parts = Path(real).relative_to(root).parts
    if not parts:
        raise InputError(f"{shown(path)}: this {what} is the folder itself; give a regular file")
    fd = _open_below(root, parts, path, what)
    opened = Opened(path, Path(real), fd)
    record(opened.real, opened.ident, opened)
    return opened


def file_in(folder: Path | str, name: str, what: str = "file") -> Opened | None:
    """`folder/name` opened when it is a regular file inside the folder, None when absent or a folder;
    refuses escapes."""
    path = Path(folder) / name
    if os.path.isdir(path) and not os.path.islink(path):
        return None
    return find_in(folder, name, what)
