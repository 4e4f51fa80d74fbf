"""The target model a drafter serves: read from its GGUF or from its Hugging Face folder.

A drafter GGUF carries the target's tokenizer, so the target supplies that metadata and the facts the
compatibility checks need (embedding length, depth, vocabulary size).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..confined_reader import find_in
from ..errors import InputError, TargetError
from ..hub import resolve as hub
from ..inputs import parse_json
from ..terminal import shown
from . import config_values as cv
from .format import KV
from .hf_vocab import tokenizer_metadata as hf_tokenizer_metadata
from .keys import ARCH, LEGACY_ARCH, General, Model, Tokenizer, per_arch
from .reader import GGUFFile, tokenizer_metadata


@dataclass
class TargetInfo:
    path: Path
    n_embd: int
    n_layer: int
    n_vocab: int
    tokenizer_kv: list[KV]  # the tokenizer.* metadata, in the order it is written
    uses_mrope: bool = False
    name: str | None = None
    repo: str | None = None  # Hub id or URL, when known
    license: str | None = None
    source: hub.HubSource | None = None  # the Hub repository and commit it was read from
    general: dict[str, Any] = field(default_factory=dict)  # a GGUF's general.* metadata
    fetched: dict | None = None  # for a GGUF read in place: bytes fetched, requests, metadata size
    files: list = field(default_factory=list)  # the local files it was read from (confine.Opened for a folder)

    @property
    def local_gguf(self) -> Path | None:
        """The target's GGUF on this machine (what llama-server can load), if it is one."""
        return self.path if self.fetched is None and self.path.is_file() else None

    @property
    def pad_token_id(self) -> int | None:
        for kv in self.tokenizer_kv:
            if kv.key == Tokenizer.PAD_ID:
                return kv.value
        return None


def read_files(path: Path) -> list:
    """The local files a target is read from: its GGUF, or its folder's config and tokenizer files
    (opened by the confined reader: links out of the folder are refused)."""
    if path.is_dir():
        try:
            found = [find_in(path, n, "target file") for n in hub.TARGET_READ_FILES]
        except InputError as err:
            raise TargetError(str(err)) from None
        return [f for f in found if f is not None]
    return [path] if path.is_file() else []


def load_target(target: str | Path | hub.HubRef, vocab_size_hint: int | None = None) -> TargetInfo:
    """The target from its GGUF or Hugging Face folder, local or named on the Hub (hub/resolve.py)."""
    model = hub.as_model(target)
    if isinstance(model, hub.HubRef):
        if model.is_gguf:
            opened = hub.open_gguf(model)
            with opened.gguf as gguf:
                info = _from_gguf(gguf, opened.local_path or Path(f"{model.repo}/{opened.source.file}"))
            info.source = opened.source
            if opened.local_path is None:
                info.fetched = {"bytes_fetched": opened.bytes_fetched, "requests": opened.requests,
                                "metadata_bytes": gguf.data_offset, "file_bytes": gguf.size}
            return info
        return _from_hf_folder(hub.target_folder(model), vocab_size_hint)
    if model.is_dir():
        return _from_hf_folder(model, vocab_size_hint)
    if model.is_file():
        with GGUFFile(model) as gguf:
            return _from_gguf(gguf, model)
    raise TargetError(f"{model}: no such target (give the target's .gguf file or its Hugging Face folder, "
                      "or a Hub repo id: owner/name, owner/name:QUANT, owner/name/file.gguf)")


def _from_gguf(gguf: GGUFFile, path: Path) -> TargetInfo:
    general = gguf.general()  # typed: text keys are valid, control-free strings
    arch = gguf.architecture
    if not arch:
        raise TargetError(f"{path}: no {General.ARCHITECTURE} key; is this a model GGUF?")
    if not isinstance(arch, str):
        raise TargetError(f"{path}: general.architecture is not a string; is this a model GGUF?")
    if arch in (ARCH, LEGACY_ARCH):
        raise TargetError(f"{path}: this is a DFlash drafter ({arch}), not a target model; give the target's "
                          "GGUF as the target (were target and drafter swapped?)")

    def need(key: str) -> int:
        value = gguf.get(key)
        if value is None:
            raise TargetError(f"{path}: key {key!r} is missing; re-convert the target with llama.cpp")
        return cv.read_target_gguf(path, key, value, TargetError)

    tokens = gguf.get(Tokenizer.TOKENS)
    if not tokens or not isinstance(tokens, list) or not isinstance(tokens[0], str):
        raise TargetError(f"{path}: no {Tokenizer.TOKENS}; the target GGUF must carry its tokenizer")
    vocab_key = per_arch(Model.VOCAB_SIZE, arch)
    n_vocab = gguf.get(vocab_key)
    n_vocab = cv.read_target_gguf(path, vocab_key, len(tokens) if n_vocab is None else n_vocab, TargetError)
    return TargetInfo(
        path=path,
        n_embd=need(per_arch(Model.EMBEDDING_LENGTH, arch)),
        n_layer=need(per_arch(Model.BLOCK_COUNT, arch)),
        n_vocab=int(n_vocab),
        tokenizer_kv=tokenizer_metadata(gguf.kv, path, TargetError),
        uses_mrope=per_arch(Model.ROPE_DIMENSION_SECTIONS, arch) in gguf.kv,
        name=general.get(General.NAME),
        repo=general.get(General.REPO_URL),
        license=general.get(General.LICENSE),
        source=hub.cache_source(path),
        general=general,
        files=read_files(path),
    )


def _text_config(config: object, source: Path) -> dict:
    config = cv.mapping(source, "(the whole file)", config, TargetError)
    return {**config, **cv.read(source, "text_config", config.get("text_config"), {}, TargetError)}


def _from_hf_folder(path: Path, vocab_size_hint: int | None) -> TargetInfo:

    config_path = path / "config.json"
    files = read_files(path)  # every file read from the folder, opened once
    opened = {f.name: f for f in files}
    if "config.json" not in opened:
        raise TargetError(f"{shown(config_path)}: not found; the target folder needs its config.json")
    try:
        config = _text_config(parse_json(opened["config.json"].read(what="target config"), config_path), config_path)
    except InputError as err:
        raise TargetError(str(err)) from None

    def need(key: str) -> int:
        if key not in config:
            raise TargetError(f"{config_path}: field {key!r} is missing")
        return cv.read(config_path, key, config[key], error=TargetError)

    n_vocab, n_embd, n_layer = need("vocab_size"), need("hidden_size"), need("num_hidden_layers")
    rope_key = "rope_parameters" if config.get("rope_parameters") else "rope_scaling"
    rope = cv.read(config_path, rope_key, config.get(rope_key), {}, TargetError)
    name_or_path = cv.read(config_path, "_name_or_path", config.get("_name_or_path"), "", TargetError)
    tokenizer_kv = hf_tokenizer_metadata(path, vocab_size_hint or n_vocab, opened)  # the slow part, last
    return TargetInfo(
        path=path,
        n_embd=n_embd,
        n_layer=n_layer,
        n_vocab=n_vocab,
        tokenizer_kv=tokenizer_kv,
        uses_mrope="mrope_section" in rope,
        name=name_or_path or hub.folder_name(path),
        repo=name_or_path if "/" in name_or_path else None,
        source=hub.cache_source(path),
        files=files,
    )
