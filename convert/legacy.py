"""Migrate a legacy fork GGUF (`general.architecture = dflash-draft`) to the mainline layout.

Tensor bytes are copied untouched; only names and metadata change: nested
`dflash-draft.dflash.*` keys become mainline keys, target layer ids are shifted by one (mainline taps
the *input* of layer L), and `dflash_fc` / `dflash_hidden_norm` get their mainline names.
"""

from __future__ import annotations

from pathlib import Path
import gguf

from ..errors import GGUFFormatError
from . import layout
from .compat import DrafterFacts, check_fits_target
from .gguf_file import FileSpan, GGUFFile, GGUFPlan, PlannedTensor, TensorInfo, kv_from_writer, write_gguf
from .target import TargetInfo

_OLD = layout.LEGACY_ARCH + "."
_NESTED = _OLD + "dflash."


def is_legacy(gguf_file: GGUFFile) -> bool:
    return gguf_file.architecture == layout.LEGACY_ARCH


def legacy_facts(src: GGUFFile) -> DrafterFacts:
    """What the compatibility rules need, from a legacy file (ids stay in the HF numbering there)."""
    ids = src.get(_NESTED + "target_layer_ids")
    hidden = src.get(_OLD + "embedding_length")
    if ids is None or hidden is None:
        missing = _NESTED + "target_layer_ids" if ids is None else _OLD + "embedding_length"
        raise GGUFFormatError(f"{src.path}: legacy DFlash file lacks {missing!r}; it cannot be migrated")
    tokens = src.get("tokenizer.ggml.tokens")
    return DrafterFacts(source=str(src.path), hidden=int(hidden), vocab=len(tokens) if tokens else None,
                        target_layer_ids=tuple(int(i) for i in ids),
                        mask_token_id=src.get(_NESTED + "mask_token_id"))


def _copy(src: GGUFFile, name: str):
    info = src.tensors[name]
    return lambda: [FileSpan(src.path, src.data_offset + info.offset, info.nbytes)]


def plan_migration(src: GGUFFile, target: TargetInfo | None = None) -> tuple[GGUFPlan, list[str]]:
    if not is_legacy(src):
        raise GGUFFormatError(
            f"{src.path}: general.architecture is {src.architecture!r}, not the legacy {layout.LEGACY_ARCH!r}")
    facts = legacy_facts(src)
    warnings = check_fits_target(facts, target) if target else []
    fc = src.tensors.get("dflash_fc.weight") or src.tensors.get("fc.weight")
    n_features = src.get(_NESTED + "n_target_features")
    if fc is not None and n_features is not None and fc.shape[-1] != n_features:
        raise GGUFFormatError(
            f"{src.path}: n_target_features {n_features} does not match dflash_fc.weight width {fc.shape[-1]}")

    new = gguf.GGUFWriter(path=None, arch=layout.ARCH)
    a = layout.ARCH
    if (block_size := src.get(_NESTED + "block_size")) is not None:
        new.add_uint32(f"{a}.block_size", int(block_size))
    new.add_array(f"{a}.target_layers", [i + 1 for i in facts.target_layer_ids])
    if facts.mask_token_id is not None:
        new.add_mask_token_id(int(facts.mask_token_id))

    plan = GGUFPlan()
    for key, kv in src.kv.items():
        if key.startswith(_NESTED) or key in ("general.architecture", "tokenizer.ggml.mask_token_id"):
            continue
        if key.startswith(_OLD):
            kv = type(kv)(a + "." + key[len(_OLD):], kv.type, kv.value, kv.sub_type, kv.raw)
        plan.add_kv([kv])
    plan.kv.insert(0, kv_from_writer(new)[0])  # general.architecture first, as in every GGUF
    plan.add_kv(kv_from_writer(new)[1:])
    for name, info in src.tensors.items():
        new_name = layout.LEGACY_TENSOR_RENAMES.get(name, name)
        plan.tensors.append(PlannedTensor(TensorInfo(new_name, info.shape, info.type), _copy(src, name)))
    return plan, warnings


def migrate(src_path: str | Path, out: str | Path, target: TargetInfo | None = None, progress=None) -> list[str]:
    with GGUFFile(src_path) as src:
        plan, warnings = plan_migration(src, target)
        write_gguf(plan, Path(out), progress)
    return warnings
