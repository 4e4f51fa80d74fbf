"""`release --push REPO`: build a release and upload it in one commit, unless REPO holds it already.

A release's card records in its front matter (`release.PROVENANCE_KEY`) the tool version, the types
and the sources: for each of the drafter and the target, the Hub repository and commit it was read
at, or for a local source each file's sha256. Before any work, the sources are resolved (the Hub's
model info only: nothing is downloaded; local files are hashed) and compared with the card in REPO:
the same tool version, the same sources and every requested type present means there is nothing to
do. Otherwise the release is built from exactly the commits compared (pinned) and committed with
publish.py. `force` redoes it regardless.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from dflash_gguf import __version__
from dflash_gguf.errors import HubError, ReleaseError
from dflash_gguf.gguf.checkpoint import Checkpoint
from dflash_gguf.gguf.target import read_files
from dflash_gguf.hashing import hash_files
from dflash_gguf.hub import resolve as hub
from dflash_gguf.hub.names import commit_id
from dflash_gguf.licenses import read_text, split_front_matter
from .card import PROVENANCE_KEY, ReleaseResult
from .publish import PublishResult, check_repo_id, publish, require_token
from .release import ReleaseSettings, parse_types, release

log = logging.getLogger(__name__)


@dataclass
class PushResult:
    repo: str
    skipped: bool
    reason: str
    sources: dict
    release: ReleaseResult | None = None
    publish: PublishResult | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def planned_sources(draft, target) -> tuple[dict, object, object]:
    """(the sources as a release records them, the drafter and the target pinned to those commits)."""
    out, pinned = {}, []
    for role, value in (("drafter", draft), ("target", target)):
        model = hub.as_model(value)
        if isinstance(model, hub.HubRef):
            src = hub.resolve_source(model)
            commit_id(src.revision, f"{hub.hub_endpoint()}/{src.repo}", "model info sha", HubError)
            out[role] = {"repo": src.repo, "revision": src.revision, **({"file": src.file} if src.file else {})}
            pinned.append(hub.HubRef(src.repo, src.revision, path=src.file))
            continue
        if not model.exists():
            raise ReleaseError(f"{model}: no such {role} (give a local path or a Hub repo id)")
        if role == "drafter":
            out[role] = {"files": hash_files(model, Checkpoint(model).sources())}
        else:
            out[role] = {"files": hash_files(model if model.is_dir() else model.parent, read_files(model))}
        pinned.append(model)
    return out, pinned[0], pinned[1]


def published_provenance(repo: str) -> dict | None:
    """The provenance block of the card REPO holds; None when it has no card (or no such repo)."""
    # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError

    with hub.hub_errors(hub.HubRef(repo)):
        try:
            card = hub.download_file(repo, "README.md")
        except GatedRepoError:
            raise
        except (RepositoryNotFoundError, EntryNotFoundError):
            return None
    meta, _ = split_front_matter(read_text(card), f"{repo}/README.md")
    block = meta.get(PROVENANCE_KEY)
    return block if isinstance(block, dict) else None


def same_release(published: dict | None, sources: dict, types: list[str]) -> str | None:
    """Why REPO's release is this one (a sentence), or None when it is not."""
    if not published or published.get("version") != __version__:
        return None
    for role, wanted in sources.items():
        held = published.get(role) or {}
        keys = ("repo", "revision", "file") if "revision" in wanted else ("files",)
        if any(held.get(k) != wanted.get(k) for k in keys):
            return None
    if not set(types) <= set(published.get("types") or []):
        return None
    described = ", ".join(
        f"{role} {s['repo']}@{s['revision'][:12]}" if "revision" in s else f"{role} (same file sha256)"
        for role, s in sources.items())
    return f"already holds this release ({described}; {', '.join(types)}; dflash-gguf {__version__})"


def warn_before_publishing(built) -> None:
    """The release's warnings (a file stock llama.cpp cannot load among them), said before the upload."""
    for message in built.warnings:
        log.warning("%s", message)


def push_release(settings: ReleaseSettings, *, private: bool = False, progress=None) -> PushResult:
    """Release the drafter for its target to the Hub repository `settings.push_repo` in one commit,
    unless it is there."""
    repo, force, out_dir = settings.push_repo, settings.force, settings.out_dir
    check_repo_id(repo)
    require_token()
    wanted = parse_types(settings.types)
    sources, draft, target = planned_sources(settings.draft_dir, settings.target)
    if not force:
        reason = same_release(published_provenance(repo), sources, wanted)
        if reason:
            return PushResult(repo, True, f"{repo} {reason}; --force redoes it", sources)
    scratch = None
    if out_dir is None:
        scratch = Path(tempfile.mkdtemp(prefix="dflash-gguf-release-"))
        out_dir = scratch / "release"
    try:
        built = release(dataclasses.replace(settings, draft_dir=draft, target=target, types=wanted, out_dir=out_dir),
                        progress=progress)
        warn_before_publishing(built)
        message = (f"dflash-gguf {__version__}: " + ", ".join(
            f"{role} {s['repo']}@{s['revision'][:12]}" for role, s in sources.items() if "revision" in s))
        pushed = publish(out_dir, repo, private=private, message=message.rstrip(": "))
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    reason = "redone (--force)" if force else "committed"
    return PushResult(repo, False, reason, sources, built, pushed)
