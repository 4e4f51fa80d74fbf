"""The target model a drafter serves: read from its GGUF or from its Hugging Face folder.

A drafter GGUF carries the target's tokenizer, so the target supplies that metadata and the facts the
compatibility checks need (embedding length, depth, vocabulary size).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import TargetError
from .gguf_file import KV, GGUFFile
from .keys import General, Model, Tokenizer, per_arch


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

    @property
    def pad_token_id(self) -> int | None:
        for kv in self.tokenizer_kv:
            if kv.key == Tokenizer.PAD_ID:
                return int(kv.value)
        return None


def load_target(path: str | Path, vocab_size_hint: int | None = None) -> TargetInfo:
    path = Path(path)
    if path.is_dir():
        return _from_hf_folder(path, vocab_size_hint)
    if path.is_file():
        return _from_gguf(path)
    raise TargetError(f"{path}: no such target (give the target's .gguf file or its Hugging Face folder)")


def _from_gguf(path: Path) -> TargetInfo:
    with GGUFFile(path) as gguf:
        arch = gguf.architecture
        if not arch:
            raise TargetError(f"{path}: no {General.ARCHITECTURE} key; is this a model GGUF?")

        def need(key: str) -> int:
            value = gguf.get(key)
            if value is None:
                raise TargetError(f"{path}: key {key!r} is missing; re-convert the target with llama.cpp")
            return int(value)

        tokens = gguf.get(Tokenizer.TOKENS)
        if not tokens:
            raise TargetError(f"{path}: no {Tokenizer.TOKENS}; the target GGUF must carry its tokenizer")
        n_vocab = gguf.get(per_arch(Model.VOCAB_SIZE, arch)) or len(tokens)
        return TargetInfo(
            path=path,
            n_embd=need(per_arch(Model.EMBEDDING_LENGTH, arch)),
            n_layer=need(per_arch(Model.BLOCK_COUNT, arch)),
            n_vocab=int(n_vocab),
            tokenizer_kv=[kv for key, kv in gguf.kv.items() if key.startswith(Tokenizer.PREFIX)],
            uses_mrope=per_arch(Model.ROPE_DIMENSION_SECTIONS, arch) in gguf.kv,
            name=gguf.get(General.NAME),
            repo=gguf.get(General.REPO_URL),
            license=gguf.get(General.LICENSE),
        )


def _text_config(config: dict) -> dict:
    return {**config, **(config.get("text_config") or {})}


def _from_hf_folder(path: Path, vocab_size_hint: int | None) -> TargetInfo:
    from .hf_vocab import tokenizer_metadata

    config_path = path / "config.json"
    try:
        config = _text_config(json.loads(config_path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise TargetError(f"{config_path}: not found; the target folder needs its config.json") from None
    except json.JSONDecodeError as err:
        raise TargetError(f"{config_path}: not valid JSON ({err})") from None

    def need(key: str) -> int:
        if key not in config:
            raise TargetError(f"{config_path}: field {key!r} is missing")
        return int(config[key])

    n_vocab = need("vocab_size")
    tokenizer_kv = tokenizer_metadata(path, vocab_size_hint or n_vocab)
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return TargetInfo(
        path=path,
        n_embd=need("hidden_size"),
        n_layer=need("num_hidden_layers"),
        n_vocab=n_vocab,
        tokenizer_kv=tokenizer_kv,
        uses_mrope="mrope_section" in rope,
        name=config.get("_name_or_path") or path.name,
        repo=config.get("_name_or_path") if "/" in str(config.get("_name_or_path", "")) else None,
    )
