"""What a drafter GGUF is, read once: `describe()`.

`inspect` prints the description, the runner takes its `--spec-type` and draft length from it,
`quantize` and `release` their checks and card facts. Reading never raises for what the metadata
says (only for a file that is not a readable GGUF): everything wrong goes into `problems`, and
`require_runnable()` turns the ones llama.cpp cannot live with into an error.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from ..variants import VARIANTS
from . import layout
from .drafter_fit import DrafterFacts
from .config_values import MAX_BLOCK_SIZE
from .keys import ARCH, DEFAULT_BLOCK_SIZE, LEGACY_ARCH, DFlash, General, Legacy, Tokenizer
from .llama_support import support_of
from .reader import GGUFFile

# llama.cpp's --spec-type for each variant mainline runs
SPEC_TYPES = {v: row.spec_type for v, row in VARIANTS.items() if row.spec_type}
NOT_A_DRAFTER = "not a drafter"


@dataclass(frozen=True)
class TensorSummary:
    name: str
    type: str
    shape: tuple[int, ...]
    bytes: int


@dataclass
class DrafterDescription:
    path: Path
    architecture: str | None
    variant: str | None          # layout.DFLASH / DFLASH2 / DSPARK / LEGACY; None: not a drafter
    block_size: int              # what llama.cpp uses (DEFAULT_BLOCK_SIZE when the file has none)
    block_size_in_file: bool
    draft_length: int            # the longest draft llama.cpp makes with this drafter
    spec_type: str | None        # llama-server's --spec-type; None when mainline cannot run the file
    target_layers_hf: tuple[int, ...]      # HF hidden-state ids: the tap is the output of layer id
    target_layers_llama: tuple[int, ...]   # llama.cpp's: the input of layer id + 1
    mask_token_id: int | None
    vocab_size: int | None       # tokens in the embedded (target's) tokenizer
    hidden: int | None
    conv_group_size: int | None
    selector_top_k: int | None
    sample_from_anchor: bool | None
    sliding_window: int | None
    sliding_window_pattern: list[bool] | None
    causal: bool | None
    license: str | None
    # where it was converted from: {"drafter"/"target": {"repo_url", "revision"}} for what the file records
    sources: dict[str, dict[str, str]] = field(default_factory=dict)
    tensors: list[TensorSummary] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def variant_name(self) -> str:
        return layout.VARIANT_NAMES[self.variant] if self.variant else NOT_A_DRAFTER

    def count_by_type(self) -> dict[str, int]:
        return dict(sorted(Counter(t.type for t in self.tensors).items()))

    def bytes_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.type] = out.get(t.type, 0) + t.bytes
        return out

    def require_runnable(self) -> None:
        """CheckpointError unless mainline llama.cpp can load this file as a drafter."""
        path = self.path
        if self.variant == layout.LEGACY:
            raise CheckpointError(
                f"{path}: legacy fork layout (general.architecture = {LEGACY_ARCH}); mainline llama.cpp refuses it. "
                f"Migrate it: dflash-gguf convert {path} -o NEW.gguf")
        if self.variant is None:
            raise CheckpointError(
                f"{path}: general.architecture is {self.architecture!r}, not {ARCH!r}: not a DFlash drafter "
                "(were target and drafter swapped? the drafter goes to --draft)")
        if self.hidden is None or not self.target_layers_hf:
            missing = DFlash.EMBEDDING_LENGTH if self.hidden is None else DFlash.TARGET_LAYERS
            raise CheckpointError(f"{path}: key {missing} is missing; re-convert the drafter with dflash-gguf convert")
        if not 2 <= self.block_size <= MAX_BLOCK_SIZE or any(i < 0 for i in self.target_layers_hf):
            raise CheckpointError(
                f"{path}: {DFlash.BLOCK_SIZE} {self.block_size} (2..{MAX_BLOCK_SIZE}) or {DFlash.TARGET_LAYERS} "
                f"{list(self.target_layers_llama)} (ids from 1) out of range; re-convert the drafter")

    def facts(self) -> DrafterFacts:
        """What the compatibility rules (dflash_gguf/gguf/drafter_fit.py) need."""
        if self.hidden is None:
            key = Legacy.EMBEDDING_LENGTH if self.variant == layout.LEGACY else DFlash.EMBEDDING_LENGTH
            raise CheckpointError(f"{self.path}: key {key} is missing; re-convert the drafter with dflash-gguf convert")
        return DrafterFacts(source=str(self.path), hidden=self.hidden, vocab=self.vocab_size,
                            target_layer_ids=self.target_layers_hf, mask_token_id=self.mask_token_id,
                            conv_group_size=self.conv_group_size, selector_top_k=self.selector_top_k)

    def to_dict(self) -> dict[str, Any]:
        """The report `inspect --json` prints."""
        return {
            "file": str(self.path),
            "architecture": self.architecture,
            "variant": self.variant_name,
            "spec_type": self.spec_type,
            "runs_on": support_of(self).to_dict(),  # which llama.cpp runs it (dflash_gguf/gguf/llama_support.py)
            "block_size": self.block_size,
            "block_size_in_file": self.block_size_in_file,
            "draft_length": self.draft_length,
            "target_layers": {"hf": list(self.target_layers_hf), "llama_cpp": list(self.target_layers_llama)},
            "mask_token_id": self.mask_token_id,
            "vocab_size": self.vocab_size,
            "sample_from_anchor": self.sample_from_anchor,
            "sliding_window": self.sliding_window,
            "sliding_window_pattern": self.sliding_window_pattern,
            "causal": self.causal,
            "license": self.license,
            "sources": self.sources,
            "tensor_count": len(self.tensors),
            "bytes_by_type": self.bytes_by_type(),
            "tensors": [{"name": t.name, "type": t.type, "shape": list(t.shape), "bytes": t.bytes}
                        for t in self.tensors],
            "problems": list(self.problems),
        }


def draft_length(variant: str | None, block_size: int, sample_from_anchor: bool | None) -> int:
    """common/speculative.cpp: DFlash denoises [anchor, mask * (block_size-1)] into block_size-1
    drafts; anchor-first DSpark (dflash.sample_from_anchor, default true) drafts a whole block."""
    n = block_size if variant == layout.DSPARK and sample_from_anchor is not False else block_size - 1
    return max(1, n)


def _variant(f: GGUFFile) -> str | None:
    if f.architecture == LEGACY_ARCH:
        return layout.LEGACY
    if f.architecture != ARCH:
        return None
    for marker, variant in layout.VARIANT_MARKERS.items():
        if marker in f.tensors:
            return variant
    return layout.DFLASH


class _Reader:
    """Typed reads of metadata values; a value of the wrong type is a problem, read as absent."""

    def __init__(self, f: GGUFFile, problems: list[str]):
        self.f, self.problems = f, problems

    def int(self, key: str) -> int | None:
        value = self.f.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.problems.append(f"{key} is {value!r}: expected an integer")
            return None
        return value

    def ints(self, key: str) -> tuple[int, ...]:
        value = self.f.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            self.problems.append(f"{key} is {value!r}: expected an array of integers")
            return ()
        return tuple(value)

    def bool(self, key: str) -> bool | None:
        value = self.f.get(key)
        if value is None or isinstance(value, bool):
            return value
        self.problems.append(f"{key} is {value!r}: expected a boolean")
        return None


def _positive_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def value_problems(f: GGUFFile, read: _Reader, hf_ids: tuple[int, ...], block_size: int | None) -> list[str]:
    """Values llama.cpp reads without complaint and then mishandles: empty, low or repeated target
    layers, block sizes that draft nothing or cannot be allocated, non-finite epsilons, a
    sliding-window pattern of the wrong length, numbers stored as something else."""
    problems = [f"{key} is {f.kv[key].type.name} {str(f.kv[key].value)[:20]!r}, not a number"
                for key in DFlash.REQUIRED if key != DFlash.TARGET_LAYERS and key in f.kv
                and (isinstance(f.kv[key].value, bool) or not isinstance(f.kv[key].value, (int, float)))]
    if DFlash.TARGET_LAYERS in f.kv and isinstance(f.get(DFlash.TARGET_LAYERS), list) and not hf_ids:
        problems.append(f"{DFlash.TARGET_LAYERS} is empty: the drafter taps no target layer")
    if any(i < 0 for i in hf_ids):
        problems.append(f"{DFlash.TARGET_LAYERS} {[i + 1 for i in hf_ids]} holds ids below 1 "
                        "(llama.cpp numbers taps from 1)")
    if len(set(hf_ids)) != len(hf_ids):
        problems.append(f"{DFlash.TARGET_LAYERS} {[i + 1 for i in hf_ids]} names a layer twice")
    if block_size is not None and not 2 <= block_size <= MAX_BLOCK_SIZE:
        problems.append(f"{DFlash.BLOCK_SIZE} {block_size} is outside 2..{MAX_BLOCK_SIZE}: llama.cpp drafts nothing "
                        "below 2 and fails to allocate absurd blocks")
    for key in (DFlash.LAYERNORM_RMS_EPS, DFlash.ROPE_FREQ_BASE):
        if key in f.kv and not _positive_finite(f.get(key)):
            problems.append(f"{key} = {f.get(key)!r} is not a positive finite number")
    pattern, n_layers = f.get(DFlash.SLIDING_WINDOW_PATTERN), f.get(DFlash.BLOCK_COUNT)
    if isinstance(pattern, list) and isinstance(n_layers, int) and len(pattern) != n_layers:
        problems.append(f"{DFlash.SLIDING_WINDOW_PATTERN} has {len(pattern)} entries for {n_layers} layers")
    return problems


def _sources(f: GGUFFile) -> dict[str, dict[str, str]]:
    """The provenance keys the converter writes: the drafter's Hub repository and commit, the target's."""
    keys = {"drafter": (General.SOURCE_REPO_URL, General.SOURCE_REVISION),
            "target": (General.BASE_MODEL_REPO_URL.format(id=0), General.BASE_MODEL_REVISION.format(id=0))}
    out = {}
    for role, (url, revision) in keys.items():
        found = {name: str(f.get(key)) for name, key in (("repo_url", url), ("revision", revision))
                 if isinstance(f.get(key), str)}
        if found:
            out[role] = found
    return out


def describe(source: str | Path | GGUFFile) -> DrafterDescription:
    """Describe a drafter GGUF (a path, or a GGUFFile the caller keeps open)."""
    if isinstance(source, GGUFFile):
        return _describe(source)
    with GGUFFile(source) as f:
        return _describe(f)


def _describe(f: GGUFFile) -> DrafterDescription:
    problems: list[str] = []
    read = _Reader(f, problems)
    variant = _variant(f)
    if variant is None:
        problems.append(f"{General.ARCHITECTURE} is {f.architecture!r}: not a DFlash drafter")
    if variant == layout.LEGACY:
        problems.append("legacy fork layout (dflash-draft): mainline llama.cpp refuses it; "
                        "migrate with `dflash-gguf convert FILE.gguf -o NEW.gguf`")
        block_size = read.int(Legacy.BLOCK_SIZE)
        hf_ids = read.ints(Legacy.TARGET_LAYER_IDS)
        mask = read.int(Legacy.MASK_TOKEN_ID)
        hidden = read.int(Legacy.EMBEDDING_LENGTH)
    else:
        block_size = read.int(DFlash.BLOCK_SIZE)
        hf_ids = tuple(i - 1 for i in read.ints(DFlash.TARGET_LAYERS))
        mask = read.int(Tokenizer.MASK_ID)
        hidden = read.int(DFlash.EMBEDDING_LENGTH)
    if variant in (layout.DFLASH, layout.DFLASH2, layout.DSPARK):
        problems += [f"missing key {k}" for k in DFlash.REQUIRED if k not in f.kv]
        if variant == layout.DFLASH2:
            present = [k for k in DFlash.DFLASH2 if k in f.kv]
            if len(present) != len(DFlash.DFLASH2):
                problems.append("DFlash 2 needs all of " + ", ".join(DFlash.DFLASH2)
                                + f"; found {', '.join(present) or 'none'}")
        if (DFlash.SLIDING_WINDOW in f.kv) != (DFlash.SLIDING_WINDOW_PATTERN in f.kv):
            problems.append("sliding-window layers without the window metadata: "
                            f"{DFlash.SLIDING_WINDOW} and {DFlash.SLIDING_WINDOW_PATTERN} must come together; "
                            "re-convert")
        problems += value_problems(f, read, hf_ids, block_size)
        n_layers = read.int(DFlash.BLOCK_COUNT)
        if n_layers is not None and not 1 <= n_layers <= len(f.tensors):  # bound the work by the file
            problems.append(f"{DFlash.BLOCK_COUNT} {n_layers} does not fit the {len(f.tensors)} tensors the file holds")
        elif n_layers is not None and any(variant in rule.variants for rule in layout.TENSORS):
            wanted = {rule.gguf_name(bid) for rule, bid in layout.expected_tensors(variant, n_layers)}
            missing = sorted(wanted - set(f.tensors))
            if missing:
                problems.append(f"missing tensor(s): {', '.join(missing[:6])}" + (" ..." if len(missing) > 6 else ""))
    tokens = f.get(Tokenizer.TOKENS)
    if Tokenizer.TOKENS not in f.kv:
        problems.append(f"no tokenizer ({Tokenizer.TOKENS}): re-convert with --target")
    n_vocab = len(tokens) if isinstance(tokens, list) and tokens else None
    if mask is not None and n_vocab and not 0 <= mask < n_vocab:
        problems.append(f"mask token id {mask} is outside the vocabulary of {n_vocab}")

    anchor = read.bool(DFlash.SAMPLE_FROM_ANCHOR) if variant == layout.DSPARK else None
    effective_block = block_size if block_size is not None else DEFAULT_BLOCK_SIZE
    pattern = f.get(DFlash.SLIDING_WINDOW_PATTERN)
    return DrafterDescription(
        path=Path(f.path),
        architecture=f.architecture,
        variant=variant,
        block_size=effective_block,
        block_size_in_file=block_size is not None,
        draft_length=draft_length(variant, effective_block, anchor),
        spec_type=SPEC_TYPES.get(variant) if variant else None,
        target_layers_hf=hf_ids,
        target_layers_llama=tuple(i + 1 for i in hf_ids),
        mask_token_id=mask,
        vocab_size=n_vocab,
        hidden=hidden,
        conv_group_size=read.int(DFlash.CONV_GROUP_SIZE),
        selector_top_k=read.int(DFlash.SELECTOR_TOP_K),
        sample_from_anchor=anchor,
        sliding_window=read.int(DFlash.SLIDING_WINDOW),
        sliding_window_pattern=list(pattern) if isinstance(pattern, list) else None,
        causal=read.bool(DFlash.CAUSAL),
        license=f.get(General.LICENSE),
        sources=_sources(f),
        tensors=[TensorSummary(t.name, t.type.name, tuple(t.shape), t.nbytes) for t in f.tensors.values()],
        problems=problems,
    )
