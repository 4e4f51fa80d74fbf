"""Publish a release folder to the Hugging Face Hub as one atomic commit.

The folder is checked first (a model card whose license allows sharing, the files that license
requires, drafter files named `dflash-*.gguf` / `dspark-*.gguf` at the root and never split); then the repository is
created if needed and every file goes up in a single `HfApi.create_commit`, so the repository is
never visible without its card and license. The token comes from huggingface_hub (HF_TOKEN or the
stored login) and never appears in anything this module returns or raises.
"""

from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dflash_gguf import __version__
from dflash_gguf.confined_reader import check_inside, file_in, find_in
from dflash_gguf.errors import DflashError, PublishError
from dflash_gguf.errors import LicenseError
from dflash_gguf.gguf import layout
from dflash_gguf.hub import transport as hub_transport
from dflash_gguf.hub import names as hub_names
from dflash_gguf.inputs import TEXT_LIMIT
from dflash_gguf.licenses import read_text, split_front_matter
from dflash_gguf.owned_folder import MANIFEST
from dflash_gguf.secrets import hub_token, known_secrets, refuse_secrets_in_file, scrub
from dflash_gguf.terminal import shown
from . import license_rules as lic
from .card import recorded_sha256

log = logging.getLogger(__name__)

_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$")


@dataclass(frozen=True)
class Upload:
    path: str    # path in the repository (POSIX)
    bytes: int
    local: str
    # the file as opened and checked (confine.Opened): the commit sends its bytes, never what `local`
    # names by the time the upload starts (a file swapped for a link after the listing is not followed)
    opened: Any = field(default=None, compare=False, repr=False)

    def content(self):
        return self.opened.rewound() if self.opened is not None else self.local


def check_repo_id(repo: str) -> str:
    return hub_names.check_repo_id(repo, "--repo", PublishError)


_LISTED = re.compile(r"\]\(\./([^)\s#?]+)\)")


def release_listing(meta: dict, body: str) -> set[str]:
    """The files a release consists of: its card, every file the card links to (`[x](./x)`: the
    variants table, NOTICE, license files) and a `license_link` naming a file."""
    listed = {"README.md", *_LISTED.findall(body)}
    link = meta.get("license_link")
    if isinstance(link, str) and link and "://" not in link:
        listed.add(link.removeprefix("./"))
    return listed


def _check_recorded(opened, path: Path, card: Path, recorded: set[str]) -> None:
    """The card's sha256 for a file, checked on the open file whose bytes the commit sends."""
    actual = opened.sha256()
    wrong = sorted(recorded - {actual})
    if wrong:
        raise PublishError(f"{shown(path)}: its sha256 is {actual}, but {shown(card)} records {wrong[0]}; the file "
                           "is not the one the release was made with: run `dflash-gguf release` again or restore it")


def plan_upload(folder: str | Path) -> tuple[list[Upload], list[str]]:
    """(every file of the commit, the hidden entries left out), after checking that the folder holds
    exactly what its card lists, nothing that leads out of it, no file holding the user's token, and
    that it may be published."""
    folder = Path(folder)
    if not folder.is_dir():
        raise PublishError(f"{folder}: not a folder; give the folder `dflash-gguf release` wrote")
    readme = file_in(folder, "README.md", "model card")
    if readme is None:
        raise PublishError(f"{folder / 'README.md'}: missing; a release needs its model card (license, base_model) "
                           "in the same commit")
    meta, body = split_front_matter(read_text(readme), str(readme.path))
    listed = release_listing(meta, body)
    recorded = recorded_sha256(body)
    uploads, ggufs, extra, skipped = [], [], [], []
    for path in sorted(folder.iterdir()):
        name = path.name
        if name.startswith("."):
            if name != MANIFEST:  # release's record of what it wrote: never sent, not worth a mention
                skipped.append(name)  # .git, editor leftovers: never part of a release, never read
            continue
        check_inside(path, folder)
        if path.is_dir():
            extra.append(name + "/")
            continue
        if not path.is_file():
            raise PublishError(f"{path}: not a regular file")
        if path.suffix == ".gguf":
            if not layout.is_drafter_file(name):
                raise PublishError(f"{path}: drafter files sit at the folder's root and are named dflash-*.gguf "
                                   "or dspark-*.gguf (llama.cpp's drafter discovery looks for those prefixes)")
            if _SPLIT.search(name):
                raise PublishError(f"{path}: split GGUF; publish one file per quantization, never split")
        if name not in listed:
            extra.append(name)
            continue
        opened = find_in(folder, name, "release file")  # opened once: what is checked is what is sent
        if opened is None:
            raise PublishError(f"{path}: vanished while the folder was read")
        if path.suffix != ".gguf":  # a card or a license text: never gigabytes
            opened.within(TEXT_LIMIT, "release file")
        refuse_secrets_in_file(opened, path)
        if name in recorded:
            _check_recorded(opened, path, readme.path, recorded[name])
        if path.suffix == ".gguf":
            ggufs.append(path)
        uploads.append(Upload(name, opened.size, str(path), opened))
    if extra:
        more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
        raise PublishError(f"{folder}: {', '.join(extra[:5])}{more} not part of the release (its README.md does not "
                           "list them); a release holds only what its card lists: move them out of the folder")
    missing = sorted(listed - {u.path for u in uploads})
    if missing:
        raise PublishError(f"{readme.path}: lists {', '.join(missing[:5])}, which the folder lacks")
    if not ggufs:
        raise PublishError(f"{folder}: no dflash-*.gguf or dspark-*.gguf file to publish")
    problems = lic.publish_problems(folder, ggufs)
    if problems:
        raise LicenseError("; ".join(problems))
    return uploads, skipped


def _one_line(err: Exception) -> str:
    """An exception as one line: the HTTP status and the Hub's own message when there is one."""
    server = getattr(err, "server_message", None)
    response = getattr(err, "response", None)
    status = getattr(response, "status_code", None)
    if server:
        text = f"HTTP {status}: {server}" if status else str(server)
    else:
        text = next((ln.strip() for ln in str(err).splitlines() if ln.strip()), type(err).__name__)
    return " ".join(text.split())


def require_token() -> str:
    """huggingface_hub's token (HF_TOKEN or the stored login); refused without one."""
    hub_transport.install()
    token = hub_token()
    if not token:
        raise PublishError("no Hugging Face token: set HF_TOKEN or run `hf auth login` (or use --dry-run)")
    return token


def _preupload(api, repo: str, additions: list, token) -> None:
    """Ask the Hub how it takes each file (huggingface_hub's pre-upload), the small files first, and refuse
    before anything is committed when it answers that it would ignore one (`shouldIgnore`: a rule of the
    repository's .gitignore): create_commit would leave the file out and still succeed, publishing a
    release without its card or license. Large (LFS) files are uploaded here, as create_commit would."""
    ggufs = [op.path_in_repo.endswith(".gguf") for op in additions]
    for group in ([op for op, big in zip(additions, ggufs) if not big], [op for op, big in zip(additions, ggufs) if big]):
        if not group:
            continue
        api.preupload_lfs_files(repo, group, repo_type="model", token=token)
        ignored = [op.path_in_repo for op in group if op._should_ignore]  # set by the pre-upload answer
        if ignored:
            more = f" and {len(ignored) - 3} more" if len(ignored) > 3 else ""
            raise PublishError(f"{repo}: the Hub answered that it would ignore {', '.join(map(shown, ignored[:3]))}"
                               f"{more} (a rule of the repository's .gitignore); nothing was committed, as a release "
                               "never goes up without every file: remove the rule from the repository's .gitignore")


@dataclass
class PublishResult:
    repo: str
    private: bool
    dry_run: bool
    files: list[dict]
    total_bytes: int
    skipped: list[str]                # hidden entries of the folder, never read nor sent
    commit_url: str | None = None
    commit_oid: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def publish(folder: str | Path, repo: str, *, private: bool = False, dry_run: bool = False,
            api=None, message: str | None = None) -> PublishResult:
    """Create `repo` if needed and commit every file of `folder` to it in one commit.

    `api` is an `huggingface_hub.HfApi` (default: one for HF_ENDPOINT with the user's token).
    `dry_run` checks and lists the commit without touching the network.
    """
    check_repo_id(repo)
    uploads, skipped = plan_upload(folder)
    if dry_run:
        return PublishResult(repo, private, dry_run, [{"path": u.path, "bytes": u.bytes} for u in uploads],
                             sum(u.bytes for u in uploads), skipped)
    return commit_files(uploads, repo, private=private, api=api, message=message, skipped=skipped)


def commit_files(uploads: list[Upload], repo: str, *, private: bool = False, api=None, message: str | None = None,
                 skipped: list[str] | None = None, delete: list[str] = ()) -> PublishResult:
    """Create `repo` if needed (an existing one is left as it is), add `uploads` and remove `delete`
    in one commit; the repository's other files stay."""
    hub_transport.install()
    # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    result = PublishResult(repo, private, False, [{"path": u.path, "bytes": u.bytes} for u in uploads],
                           sum(u.bytes for u in uploads), list(skipped or []))
    api = api or HfApi()
    token = api.token if getattr(api, "token", None) else require_token()
    secrets = [token] if isinstance(token, str) else []
    operations = [CommitOperationAdd(path_in_repo=u.path, path_or_fileobj=u.content()) for u in uploads]
    operations += [CommitOperationDelete(path_in_repo=path) for path in delete]
    summary = message or f"Upload {len(uploads)} files with dflash-gguf {__version__}"
    description = "\n".join([f"- {u.path} ({u.bytes} bytes)" for u in uploads] + [f"- removed {p}" for p in delete])
    try:
        log.info("creating %s (exist_ok)", repo)
        api.create_repo(repo, repo_type="model", private=True if private else None, exist_ok=True, token=token)
        _preupload(api, repo, [op for op in operations if isinstance(op, CommitOperationAdd)], token)
        log.info("committing %d files to %s", len(uploads), repo)
        info = api.create_commit(repo, operations, commit_message=summary, commit_description=description,
                                 repo_type="model", token=token)
    except DflashError:
        raise
    except Exception as err:  # noqa: BLE001 - the network boundary: one line, never the token
        raise PublishError(scrub(f"publishing to {repo} failed: {_one_line(err)}", secrets + known_secrets())) from None
    result.commit_url = str(info.commit_url)
    result.commit_oid = str(info.oid)
    return result
