"""`release --into REPO`: the drafter placed beside the target's own quantizations in its GGUF repository.

llama.cpp's `-hf REPO:QUANT --spec-type draft-dflash` (`common/download.cpp` of the pinned tree)
downloads, next to the model file it picks, the best `dflash-*.gguf` (or `dspark-*.gguf`) of the
same repository whose folder is the model's folder or one above it: deepest folder first, then the
file whose name ends in `-<QUANT>.gguf`, then the closest number of bits. So the variants go, named
`dflash-<Target>-<QUANT>.gguf`, into the deepest folder that holds every model file of the
repository (its root for the usual flat layout), and each quant of the target finds the variant of
the same quant, or the nearest one.

The repository's README.md is the target's card and is never touched: the release's own card and
license files go into the folder `<prefix>-<Target>/` beside the variants, its links pointing one
level up. The card's provenance block is what a later `--into` compares before doing any work: the
same drafter sources, the same target file (by its sha256: the repository's commit moves with every
upload, ours included), the same types and dflash-gguf version mean there is nothing to do.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dflash_gguf import __version__
from dflash_gguf.errors import ReleaseError
from dflash_gguf.gguf import layout
from dflash_gguf.hub import resolve as hub
from dflash_gguf.licenses import read_text, split_front_matter
from .card import PROVENANCE_KEY, ReleaseResult
from .file_names import QUANT_SUFFIX, safe_name, variant_file
from .publish import PublishResult, Upload, check_repo_id, commit_files, plan_upload, require_token
from .push import planned_sources, same_release, warn_before_publishing
from .release import ReleaseSettings, parse_types, release

# The quant llama.cpp's -hf takes when none is named (find_best_model): these, else the first model file.
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")


@dataclass
class SidecarResult:
    repo: str
    folder: str               # the folder of the repository the variants went into ("" = its root)
    skipped: bool
    reason: str
    files: list[str]          # paths in the repository
    sources: dict
    release: ReleaseResult | None = None
    publish: PublishResult | None = None
    removed: list[str] = field(default_factory=list)  # our earlier variants this release replaces

    def to_dict(self) -> dict:
        return asdict(self)


def model_files(files: list[str]) -> list[str]:
    """The repository's model GGUFs, as llama.cpp's -hf tells them from sidecars (drafters, projectors,
    importance matrices)."""
    return [f for f in files if f.endswith(".gguf") and "imatrix" not in posixpath.basename(f)
            and not posixpath.basename(f).lower().startswith(hub.SIDECAR_PREFIXES)]


def placement_folder(models: list[str]) -> str:
    """The deepest folder holding every model file ("" for the repository's root)."""
    folders = [posixpath.dirname(f).split("/") if "/" in f else [] for f in models]
    common: list[str] = []
    for parts in zip(*folders):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return "/".join(common)


def default_target(repo: str, revision: str | None, files: list[str]) -> hub.HubRef:
    """The target file `llama-server -hf REPO` runs when no quant is named."""
    models = model_files(files)
    for quant in DEFAULT_QUANTS:
        pattern = re.compile(rf"{quant}[.-]", re.IGNORECASE)
        for f in models:
            if pattern.search(f) and hub.split_first(f):
                return hub.HubRef(repo, revision, path=f)
    first = next((f for f in models if hub.split_first(f)), None)
    if first is None:
        raise ReleaseError(f"--into {repo}: the repository holds no model GGUF to place a drafter beside")
    return hub.HubRef(repo, revision, path=first)


def _listing(repo: str, revision: str | None) -> list[str]:
    info = hub.model_info(hub.HubRef(repo, revision))
    return list(info.files)


def _target_for(into: str, revision: str | None, target, files: list[str]):
    """The target to convert against: REPO's default quant when none is given; a Hub target must be
    a file of REPO (the drafter carries its tokenizer)."""
    if target is None:
        return default_target(into, revision, files)
    model = hub.as_model(target)
    if isinstance(model, hub.HubRef) and model.repo != into:
        raise ReleaseError(f"--target {model}: --into {into} places the drafter beside {into}'s own quants, so it "
                           f"is converted against one of them; name one as {into}:QUANT, or omit --target")
    return target


def sidecar_card_folder(folder: str, prefix: str, name: str) -> str:
    return posixpath.join(folder, f"{prefix}-{name}") if folder else f"{prefix}-{name}"


def _published_provenance(repo: str, card_paths: list[str], files: list[str]) -> dict | None:
    for path in card_paths:
        if path in files:
            with hub.hub_errors(hub.HubRef(repo)):
                card = hub.download_file(repo, path)
            meta, _ = split_front_matter(read_text(card), f"{repo}/{path}")
            block = meta.get(PROVENANCE_KEY)
            if isinstance(block, dict):
                return block
    return None


def _target_sha256(repo: str, revision: str | None, path: str) -> str | None:
    # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
    from huggingface_hub import HfApi

    with hub.hub_errors(hub.HubRef(repo, revision)):
        entries = list(HfApi().get_paths_info(repo, [path], revision=revision))
    lfs = getattr(entries[0], "lfs", None) if entries else None
    return getattr(lfs, "sha256", None)


def _as_sidecar_sources(sources: dict, target_sha256: str | None) -> dict:
    """The sources compared for a sidecar: the target by file and sha256, not by the repository's commit."""
    target = sources["target"]
    if "revision" not in target:
        return sources
    return {**sources, "target": {"files": {target["file"]: target_sha256}}}


_GGUF_LINK = re.compile(r"\]\(\./([^)\s/]+\.gguf)\)")


def _sidecar_card(text: str) -> str:
    """The release card for its place in the card folder: the variants are one level up."""
    return _GGUF_LINK.sub(r"](../\1)", text)


def release_into(settings: ReleaseSettings, *, revision: str | None = None, progress=None) -> SidecarResult:
    """Release the drafter into the GGUF repository `settings.into_repo`, beside its quants, in one commit."""
    into, force, name = settings.into_repo, settings.force, settings.name
    check_repo_id(into)
    require_token()
    wanted = parse_types(settings.types)
    files = _listing(into, revision)
    models = model_files(files)
    if not models:
        raise ReleaseError(f"--into {into}: the repository holds no model GGUF to place a drafter beside")
    folder = placement_folder(models)
    target = _target_for(into, revision, settings.target, files)
    sources, draft, target = planned_sources(settings.draft_dir, target)
    target_ref = target if isinstance(target, hub.HubRef) else None
    file_name = posixpath.basename(target_ref.path) if target_ref else Path(target).name
    stem = Path(file_name).stem
    label = safe_name(name) if name else safe_name(QUANT_SUFFIX.sub("", stem) or stem)
    quant = QUANT_SUFFIX.search(stem)
    compared = _as_sidecar_sources(sources, _target_sha256(into, target_ref.revision, target_ref.path) if target_ref else None)
    cards = [f"{sidecar_card_folder(folder, p, label)}/README.md" for p in sorted(set(layout.FILE_PREFIXES.values()))]
    published = _published_provenance(into, cards, files)
    if not force:
        reason = same_release(published, compared, wanted)
        if reason:
            return SidecarResult(into, folder, True, f"{into} {reason}; --force redoes it", [], sources)

    scratch = Path(tempfile.mkdtemp(prefix="dflash-gguf-sidecar-"))
    try:
        out = settings.out_dir or scratch / "release"
        built = release(dataclasses.replace(settings, draft_dir=draft, target=target, types=wanted, out_dir=out,
                                            name=label),
                        progress=progress, sidecar_of=into, sidecar_quant=quant.group(1).upper() if quant else None)
        warn_before_publishing(built)
        uploads, _ = plan_upload(out)  # the checks `publish` makes: license, listing, nothing leading out
        card_dir = sidecar_card_folder(folder, built.file_prefix, label)
        placed = []
        for u in uploads:
            if u.path.endswith(".gguf"):
                placed.append(Upload(posixpath.join(folder, u.path) if folder else u.path, u.bytes, u.local, u.opened))
                continue
            if u.path == "README.md":
                card = scratch / "README.md"
                card.write_text(_sidecar_card(u.opened.text(what="model card")), encoding="utf-8")
                placed.append(Upload(f"{card_dir}/{u.path}", card.stat().st_size, str(card)))
                continue
            placed.append(Upload(f"{card_dir}/{u.path}", u.bytes, u.local, u.opened))
        message = f"dflash-gguf {__version__}: {built.file_prefix}-{label} drafter beside the quants " \
                  f"({', '.join(wanted)})"
        stale = _stale_variants(published, built, label, folder, files, {u.path for u in placed})
        pushed = commit_files(placed, into, message=message, delete=stale)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return SidecarResult(into, folder, False, "redone (--force)" if force else "committed",
                         [u.path for u in placed], sources, built, pushed, stale)


def _stale_variants(published: dict | None, built: ReleaseResult, label: str, folder: str, files: list[str],
                    placed: set[str]) -> list[str]:
    """Our earlier variants that this release does not replace: the types the card in the repository
    lists, under this release's names, when the repository still has them. Left there, `-hf` could
    pick a variant of an older drafter for its quant; files the card does not list are not ours."""
    old_types = (published or {}).get("types") or []
    variant = next(v for v, prefix in layout.FILE_PREFIXES.items() if prefix == built.file_prefix)
    names = [variant_file(label, str(t), variant) for t in old_types]
    paths = [posixpath.join(folder, n) if folder else n for n in names]
    return sorted(p for p in set(paths) if p in files and p not in placed)
