"""What a release is called and where its models come from: file names, Hub repo ids, the target
(local, or named on the Hub) and its declared license."""

from __future__ import annotations

import re
from pathlib import Path

from dflash_gguf.confined_reader import find_in
from dflash_gguf.errors import InputError, ReleaseError
from dflash_gguf.gguf import config_values as cv
from dflash_gguf.gguf import layout
from dflash_gguf.gguf.keys import General
from dflash_gguf.gguf.license import license_from_gguf
from dflash_gguf.gguf.reader import GGUFFile
from dflash_gguf.gguf.target import TargetInfo, load_target
from dflash_gguf.hub import resolve as hub
from dflash_gguf.hub.names import QUANT_SUFFIX, is_repo_id
from dflash_gguf.inputs import parse_json
from dflash_gguf.licenses import License, license_from_folder, strictest


def safe_name(text: str) -> str:
    """A name fit for a Hub file name: letters, digits, '.', '_' and '-' only."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", text.strip()).strip("-.")
    if not name:
        raise ReleaseError(f"--name {text!r}: nothing left for a file name; give letters, digits, '.', '_', '-'")
    return name


def variant_file(name: str, qtype: str, variant: str = layout.DFLASH) -> str:
    """`dflash-<Target>-<QUANT>.gguf` (`dspark-` for DSpark), the name llama.cpp's drafter discovery looks for."""
    return f"{layout.FILE_PREFIXES[variant]}-{name}-{qtype}.gguf"


def _hub_cache_repo(path: Path) -> str | None:
    source = hub.cache_source(path)
    return source.repo if source else None


def _name_or_path(folder: Path) -> str:
    """config.json's `_name_or_path` (read through the confined reader, typed), "" when there is none."""
    try:
        opened = find_in(folder, "config.json", "config file")
        data = parse_json(opened.read(what="config file"), opened.path) if opened is not None else {}
    except InputError:
        return ""
    value = data.get("_name_or_path") if isinstance(data, dict) else None
    return cv.read(folder / "config.json", "_name_or_path", value, "", ReleaseError)


def target_facts(target: Path | TargetInfo) -> tuple[str, str | None, License]:
    """(a short name for file names, the target's Hub repo id when known, its declared license).
    `target` is a folder, a GGUF file, or a target GGUF already read (from the Hub: then the license
    its repository's card and license files declare counts too)."""
    if isinstance(target, Path) and target.is_dir():
        repo = _hub_cache_repo(target)
        name_or_path = _name_or_path(target)
        if repo is None and is_repo_id(name_or_path):
            repo = name_or_path
        declared = license_from_folder(target, repo)
        return (repo.split("/")[-1] if repo else hub.folder_name(target)), repo, declared
    if isinstance(target, TargetInfo):
        path, general, source = target.path, target.general, target.source
    else:
        path, source = target, hub.cache_source(target)
        with GGUFFile(target) as f:
            general = f.general()
    url = general.get(General.REPO_URL) or general.get(General.SOURCE_REPO_URL)
    declared = license_from_gguf(path, general)
    if source is not None and isinstance(target, TargetInfo):
        # a GGUF named on the Hub: its repository's card and license files count too, the strictest wins
        declared = strictest([declared, license_from_folder(hub.card_folder(source.repo, source.revision),
                                                                    source.repo)])
    repo = None
    if url:
        m = re.search(r"huggingface\.co/([^/\s?#]+/[^/\s?#]+)", url) or re.fullmatch(r"([^/\s]+/[^/\s]+)", url)
        repo = m.group(1) if m and is_repo_id(m.group(1)) else None
    repo = repo or (source.repo if source else None)
    return QUANT_SUFFIX.sub("", path.stem) or path.stem, repo, declared


def drafter_repo(draft_dir: Path) -> str | None:
    """The drafter's Hub repo id: from the Hub cache path, else config.json's `_name_or_path`."""
    repo = _hub_cache_repo(draft_dir)
    if repo:
        return repo
    name_or_path = _name_or_path(Path(draft_dir))
    return name_or_path if is_repo_id(name_or_path) else None


def resolve_target(target: str | Path | hub.HubRef) -> Path | TargetInfo:
    """A local target path; a target folder named on the Hub, fetched (config, tokenizer, card);
    or a target GGUF named on the Hub, read once (in place unless it is in the cache)."""
    model = hub.as_model(target)
    if isinstance(model, hub.HubRef):
        return load_target(model) if model.is_gguf else hub.target_folder(model)
    if not model.exists():
        raise ReleaseError(f"{model}: no such target (give the target's .gguf file or its Hugging Face folder, "
                           "or a Hub repo id)")
    return model
