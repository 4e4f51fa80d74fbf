"""huggingface_hub's cache, read through the confined reader (confined_reader.py).

A repository's cache folder is `models--owner--name/` under HF_HUB_CACHE, holding `refs/<revision>`
(the commit a branch or tag named when last fetched), `snapshots/<commit>/` (links into `blobs/`)
and `trees/<commit>.json` (the file listing). huggingface_hub opens these as it finds them, so a
FIFO there blocks it and a link leads it anywhere: `check_repo` checks them before it is called, and
what the project reads itself goes through `find_in`. Each must lie inside the cache, without a
link on the way (a snapshot's files may link into the repository's own `blobs/`), be a regular file
(opened without blocking and sized before it is read), and a ref must hold a commit id; anything
else is refused in one line naming the path.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..confined_reader import find_in
from ..errors import DflashError, HubError
from ..inputs import parse_json
from ..terminal import shown
from .transport import API_BODY_LIMIT, COMMIT, file_name

REF_LIMIT = 4096  # a ref file holds a commit id


def cache_root() -> Path:
    # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def repo_folder(repo: str) -> Path:
    return cache_root() / f"models--{repo.replace('/', '--')}"


def _refused(path: Path, why: str) -> HubError:
    return HubError(f"{shown(path)}: {why}; the Hugging Face cache is not read through it: remove it (the next "
                    "online run fetches it again)")


def _plain_folder(path: Path, what: str) -> bool:
    """Whether `path` is a folder that is not a link (False when absent); refused when it is something else."""
    if not os.path.lexists(path):
        return False
    if os.path.islink(path) or not os.path.isdir(path):
        raise _refused(path, f"this cached {what} is a link or not a folder")
    return True


def _storage(repo: str) -> Path | None:
    """The repository's cache folder when there is one, checked to be a folder of the cache itself."""
    root = cache_root()
    folder = repo_folder(repo)
    if not _plain_folder(folder, "repository folder"):
        return None
    if os.path.realpath(folder) != os.path.join(os.path.realpath(root), folder.name):
        raise _refused(folder, "this cached repository folder leads out of the cache")
    return folder


def _read_confined(storage: Path, name: str, what: str, limit: int) -> bytes | None:
    """The file's bytes, read confined to `storage` (a link out, a FIFO, a folder, a size over `limit`:
    the confined reader's one-line refusal); None when absent."""
    opened = find_in(storage, name, what)
    if opened is None:
        return None
    try:
        return opened.read(limit, what)
    finally:
        opened.close()


def cached_commit(repo: str, revision: str) -> str | None:
    """The commit `revision` names in the cache: itself when it is one, else what `refs/<revision>`
    holds; None when the cache has no such ref."""
    if COMMIT.fullmatch(revision):
        return revision
    storage = _storage(repo)
    if storage is None:
        return None
    data = _read_confined(storage, f"refs/{revision}", "cached ref", REF_LIMIT)
    if data is None:
        return None
    commit = data.decode("ascii", errors="replace").strip()
    if not COMMIT.fullmatch(commit):
        raise _refused(storage / "refs" / revision, "this cached ref does not hold a commit id (40 hex digits)")
    return commit


def snapshot(repo: str, revision: str) -> Path | None:
    """The cached snapshot folder `revision` names, checked (None when not cached)."""
    commit = cached_commit(repo, revision)
    storage = _storage(repo)
    if commit is None or storage is None:
        return None
    if not _plain_folder(storage / "snapshots", "snapshots folder"):
        return None
    folder = storage / "snapshots" / commit
    return folder if _plain_folder(folder, "snapshot") else None


def check_repo(repo: str, revision: str | None) -> Path | None:
    """Everything of the repository's cache huggingface_hub reads for `revision`, checked before it
    does: the ref, the snapshot folder and the cached file listing (parsed with the JSON limits and the
    listing's typed reader: huggingface_hub's own parser has none). The snapshot folder, or None."""
    folder = snapshot(repo, revision or "main")
    if folder is not None:
        path = folder.parent.parent / "trees" / f"{folder.name}.json"
        listing = _read_confined(folder.parent.parent, f"trees/{path.name}", "cached file listing", API_BODY_LIMIT)
        if listing is not None:
            try:
                _check_listing(parse_json(listing, path), str(path))
            except DflashError as err:
                why = str(err).removeprefix(f"{shown(path)}: ")
                raise _refused(path, f"this cached file listing is unusable ({why})") from None
    return folder


def _check_listing(payload, where: str) -> None:
    """A cached file listing as huggingface_hub writes it (`{"format_version": 1, "files": {path: {"size",
    "blob_id", ...}}}`), through the typed reader before huggingface_hub parses it (with no depth limit)
    and builds downloads from it. A listing of another format version it ignores, and so do we."""
    if not isinstance(payload, dict):
        raise HubError("not a JSON object")
    if payload.get("format_version") != 1:
        return
    files = payload.get("files")
    if not isinstance(files, dict):
        raise HubError("its 'files' is not an object")
    for name, info in files.items():
        file_name(name, where, "listed path")
        if not isinstance(info, dict) or type(info.get("size")) is not int or info["size"] < 0 \
                or not isinstance(info.get("blob_id"), str):
            raise HubError(f"{name[:80]!r} has no size or blob id")


def check_snapshot(folder: Path | str) -> Path:
    """A snapshot folder huggingface_hub returned, checked to be one of the cache's own (not a link out)."""
    folder = Path(folder)
    storage = folder.parent.parent
    if folder.parent.name != "snapshots" or not _plain_folder(folder, "snapshot") or \
            not _plain_folder(folder.parent, "snapshots folder") or \
            os.path.realpath(folder) != os.path.join(os.path.realpath(cache_root()), storage.name, "snapshots",
                                                     folder.name):
        raise _refused(folder, "this cached snapshot lies outside the cache")
    return folder
