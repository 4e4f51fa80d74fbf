"""Tokenizer metadata from a target's Hugging Face folder, the way llama.cpp's converter writes it.

Reads `tokenizer.json` directly (no transformers needed) for byte-level BPE tokenizers whose
pre-tokenizer llama.cpp knows; special ids, merges and the chat template come from gguf-py's
`SpecialVocab`. PyPI's gguf 0.19.0 lags the pinned tree's copy in one rule that matters here: with
a `ByteLevel` post-processor the pinned converter writes add_bos/add_eos = false whatever
tokenizer_config.json says. That rule is applied below; tokenizers whose post-processor or
normalizer would need more of the pinned rules are refused (convert against the target's GGUF).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import gguf

from ..confined_reader import find_in
from ..errors import InputError, TargetError
from ..inputs import decode_text, parse_json
from ..terminal import shown
from .format import KV
from .keys import ARCH, Tokenizer
from .writer import kv_from_writer

QWEN2_SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                     r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Pre-tokenizer split regexes -> llama.cpp's `tokenizer.ggml.pre` name.
KNOWN_PRE_TOKENIZERS = {
    QWEN2_SPLIT_REGEX: "qwen2",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+":
        "llama-bpe",
}


MAX_PADDING, MAX_PADDING_FACTOR = 1 << 16, 2  # unused ids a vocabulary may be padded with beyond its tokens


def _token_id(path: Path, field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 24:
        raise TargetError(f"{shown(path)}: field {field!r} holds {shown(repr(value)[:40])}, not a token id "
                          "(an integer from 0 to 2^24); fix tokenizer.json")
    return value


def _token_text(path: Path, field: str, value: object) -> str:
    if not isinstance(value, str):
        raise TargetError(f"{shown(path)}: field {field!r} holds {shown(repr(value)[:40])}, not a token string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise TargetError(f"{shown(path)}: field {field!r} holds {shown(ascii(value)[:40])}, which is not valid "
                          "UTF-8 (a lone surrogate); fix tokenizer.json") from None
    return value


def _check_merges(path: Path, model: dict, opened: dict) -> None:
    """model.merges as gguf-py reads it: "a b" strings or [a, b] pairs (or merges.txt beside it).
    Without merges gguf-py only warns, and llama.cpp refuses the BPE vocabulary it wrote."""
    merges = model.get("merges")
    if merges is None and "merges.txt" in opened:
        return
    if not (isinstance(merges, list) and merges and all(
            isinstance(m, str) or (isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m))
            for m in merges)):
        raise TargetError(f"{shown(path)}: field 'model.merges' = {shown(repr(merges)[:40])} is not a list of merges "
                          "(\"a b\" strings or [a, b] pairs); fix tokenizer.json or pass the target's GGUF")


def _check_chat_template(folder: Path, opened: dict) -> None:
    """The chat template as gguf-py reads it: tokenizer_config.json's chat_template, else the text of
    chat_template.jinja, else chat_template.json's chat_template field; a string, or a list of
    {name, template} objects (another type it skips with a warning naming its private copy of the
    file, and a malformed fallback file it does not survive)."""
    if "tokenizer_config.json" not in opened:
        return
    path = folder / "tokenizer_config.json"
    config = parse_json(opened["tokenizer_config.json"].read(what="tokenizer config"), path)
    template = config.get("chat_template") if isinstance(config, dict) else None
    if template is None and "chat_template.jinja" in opened:
        decode_text(opened["chat_template.jinja"].read(what="chat template"), folder / "chat_template.jinja",
                    "chat template")
        return
    if template is None and "chat_template.json" in opened:
        path = folder / "chat_template.json"
        fallback = parse_json(opened["chat_template.json"].read(what="chat template"), path)
        if not isinstance(fallback, dict):
            raise TargetError(f"{shown(path)}: not a JSON object with a 'chat_template' field; "
                              "fix chat_template.json or remove it")
        template = fallback.get("chat_template")
    if template is None or isinstance(template, str) or (isinstance(template, list) and all(
            isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
            for t in template)):
        return
    raise TargetError(f"{shown(path)}: field 'chat_template' = {shown(repr(template)[:40])} is not a chat template "
                      f"(a string, or a list of {{name, template}} objects); fix {path.name}")


def _looks_special(token: str) -> bool:
    """Upstream's `does_token_look_special`: added tokens that ought to be control tokens."""
    return (token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (token.startswith("<|") and token.endswith("|>"))
            or (token.startswith("<｜") and token.endswith("｜>"))
            or (token.startswith("<unused") and token.endswith(">")))


def _pre_tokenizer_name(tokenizer_path: Path, spec: dict | None) -> str:
    splits = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") == "Split":
                splits.append((node.get("pattern") or {}).get("Regex"))
            for child in node.get("pretokenizers") or []:
                walk(child)

    walk(spec)
    for regex in splits:
        if regex in KNOWN_PRE_TOKENIZERS:
            return KNOWN_PRE_TOKENIZERS[regex]
    raise TargetError(
        f"{tokenizer_path}: pre-tokenizer is not one this converter recognises from a folder "
        "(known: " + ", ".join(sorted(set(KNOWN_PRE_TOKENIZERS.values()))) + "); pass the target's GGUF as --target")


def _check_post_processing(path: Path, spec: dict) -> bool:
    """True for a ByteLevel-only post-processor; refuse the ones whose pinned rules differ from PyPI's."""
    post = spec.get("post_processor") or {}
    kinds = {p.get("type") for p in post.get("processors", [post])} if post else set()
    if kinds - {"ByteLevel"}:
        raise TargetError(
            f"{path}: post_processor {sorted(k for k in kinds if k)} is not supported from a folder; "
            "pass the target's GGUF as --target")
    normalizer = json.dumps(spec.get("normalizer") or {})
    if any(t in normalizer for t in ('"Lowercase"', '"StripAccents"', '"BertNormalizer"')):
        raise TargetError(f"{path}: lowercasing/accent-stripping normalizers are not supported from a folder; "
                          "pass the target's GGUF as --target")
    return "ByteLevel" in kinds


# What gguf-py's SpecialVocab reads from a folder: given to it as private copies of the files the
# confined reader opened, so it never opens a name of the user's folder itself.
SPECIAL_VOCAB_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json",
                       "generation_config.json", "chat_template.json", "chat_template.jinja", "merges.txt")


def tokenizer_metadata(folder: Path, vocab_size: int, opened: dict | None = None) -> list[KV]:
    """The tokenizer.* metadata of a target folder. tokenizer.json (and gguf-py's reading of
    tokenizer_config.json) is a deep external format: any value of the wrong shape in it ends in one
    line naming the folder, not a traceback. `opened`: the folder's files already opened by the
    confined reader, by name (others are opened here the same way)."""
    opened = dict(opened or {})
    try:
        for name in SPECIAL_VOCAB_FILES:
            if name not in opened and (found := find_in(folder, name, "tokenizer file")) is not None:
                opened[name] = found
    except InputError as err:
        raise TargetError(str(err)) from None
    try:
        return _tokenizer_metadata(folder, vocab_size, opened)
    except InputError as err:
        raise TargetError(str(err)) from None
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError) as err:
        raise TargetError(f"{shown(folder)}: tokenizer files are malformed ({type(err).__name__}: "
                          f"{shown(str(err)[:80])}); fix them or pass the target's GGUF as --target") from None


def _special_vocab(opened: dict, load_merges: bool = True) -> gguf.SpecialVocab:
    """gguf-py's SpecialVocab over private copies of the opened files (nothing else is there to read)."""
    with tempfile.TemporaryDirectory(prefix="dflash-gguf-tokenizer-") as private:
        for name in SPECIAL_VOCAB_FILES:
            if name in opened:
                opened[name].copy_to(Path(private) / name)
        return gguf.SpecialVocab(Path(private), load_merges=load_merges)


def _tokenizer_metadata(folder: Path, vocab_size: int, opened: dict) -> list[KV]:
    path = folder / "tokenizer.json"
    if "tokenizer.json" not in opened:
        raise TargetError(f"{shown(path)}: not found; the target folder needs tokenizer.json (or pass the target GGUF)")
    spec = parse_json(opened["tokenizer.json"].read(what="tokenizer"), path)
    if not isinstance(spec, dict):
        raise TargetError(f"{path}: not a tokenizer.json (expected a JSON object)")
    model = spec.get("model") or {}
    if not isinstance(model, dict):
        raise TargetError(f"{path}: 'model' is not a JSON object; pass the target's GGUF")
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise TargetError(f"{path}: model.type {model.get('type')!r} is not byte-level BPE; pass the target's GGUF")
    _check_merges(path, model, opened)
    _check_chat_template(folder, opened)
    pre = _pre_tokenizer_name(path, spec.get("pre_tokenizer"))
    byte_level_post = _check_post_processing(path, spec)

    by_id: dict[int, str] = {_token_id(path, "model.vocab", i): _token_text(path, "model.vocab", tok)
                             for tok, i in model["vocab"].items()}
    added_list = spec.get("added_tokens") or []
    if not isinstance(added_list, list) or not all(isinstance(t, dict) for t in added_list):
        raise TargetError(f"{shown(path)}: field 'added_tokens' is not a list of objects; fix tokenizer.json")
    added = {_token_id(path, "added_tokens.id", t.get("id")): t for t in added_list}
    for i, t in added.items():
        by_id[i] = _token_text(path, "added_tokens.content", t.get("content"))
    if not by_id:
        raise TargetError(f"{shown(path)}: the vocabulary is empty; fix tokenizer.json or pass the target's GGUF")
    if max(by_id) >= vocab_size:
        raise TargetError(f"{path}: token id {max(by_id)} is beyond the vocabulary size {vocab_size} in config.json")
    if vocab_size > MAX_PADDING_FACTOR * (max(by_id) + 1) + MAX_PADDING:
        # bounded before the work: every id up to vocab_size becomes a token entry
        raise TargetError(f"{shown(path)}: vocabulary size {vocab_size} is far beyond the {max(by_id) + 1} ids the "
                          "tokenizer defines; fix vocab_size in config.json or pass the target's GGUF")

    tokens: list[str] = []
    types: list[int] = []
    for i in range(vocab_size):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            if added[i].get("special") or _looks_special(token):
                types.append(gguf.TokenType.CONTROL)
            else:
                token = token.replace("\u2581", " ")
                types.append(gguf.TokenType.USER_DEFINED)
            tokens.append(token)
        else:
            tokens.append(token)
            types.append(gguf.TokenType.NORMAL)

    writer = gguf.GGUFWriter(path=None, arch=ARCH)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = _special_vocab(opened)
    if byte_level_post:
        special.add_special_token.update(bos=False, eos=False)
    special.add_to_gguf(writer, quiet=True)
    return [kv for kv in kv_from_writer(writer) if kv.key.startswith(Tokenizer.PREFIX)]
