"""Migrate a legacy fork GGUF (`general.architecture = dflash-draft`) to the mainline layout.

Tensor bytes are copied untouched; only names and metadata change: nested
`dflash-draft.dflash.*` keys become mainline keys, target layer ids are shifted by one (mainline taps
the *input* of layer L), and `dflash_fc` / `dflash_hidden_norm` get their mainline names.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import gguf

from dflash_gguf import typed_reader as values
from dflash_gguf.errors import GGUFFormatError
from dflash_gguf.gguf import config_values as cv
from dflash_gguf.gguf import layout
from dflash_gguf.gguf.drafter_fit import check_fits_target
from dflash_gguf.gguf.describe import describe
from dflash_gguf.gguf.format import TensorInfo
from dflash_gguf.gguf.keys import ARCH, LEGACY_ARCH, DFlash, General, Legacy, Tokenizer
from dflash_gguf.gguf.reader import GGUFFile
from dflash_gguf.gguf.target import TargetInfo
from dflash_gguf.gguf.writer import GGUFPlan, PlannedTensor, kv_from_writer, write_gguf


def is_legacy(gguf_file: GGUFFile) -> bool:
    return gguf_file.architecture == LEGACY_ARCH


# The legacy keys hold what a checkpoint's config.json fields hold: read through the same declarations
# (config_values.FIELDS), named by their key.
_FIELDS = {Legacy.EMBEDDING_LENGTH: "hidden_size", Legacy.BLOCK_COUNT: "num_hidden_layers",
           Legacy.TARGET_LAYER_IDS: "target_layer_ids", Legacy.BLOCK_SIZE: "block_size",
           Legacy.MASK_TOKEN_ID: "mask_token_id"}
_REQUIRED = (Legacy.EMBEDDING_LENGTH, Legacy.BLOCK_COUNT, Legacy.TARGET_LAYER_IDS)


def legacy_values(src: GGUFFile) -> dict[str, Any]:
    """The legacy file's DFlash values by key, typed (absent optional keys left out); GGUFFormatError
    in one line naming the file and the key otherwise."""
    out = {}
    for key, name in _FIELDS.items():
        value = src.get(key)
        if value is None:
            if key in _REQUIRED:
                raise GGUFFormatError(f"{src.path}: legacy DFlash file lacks {key!r}; it cannot be migrated")
            continue
        out[key] = replace(cv.FIELDS[name], name=key).read(src.path, value, GGUFFormatError)
    ids = out[Legacy.TARGET_LAYER_IDS]
    if len(set(ids)) != len(ids):
        raise GGUFFormatError(f"{src.path}: {Legacy.TARGET_LAYER_IDS} {ids} names a layer twice; it cannot be migrated")
    return out


def _copy(src: GGUFFile, name: str):
    span = src.tensor_span(name)
    return lambda: [span]


def plan_migration(src: GGUFFile, target: TargetInfo | None = None) -> tuple[GGUFPlan, list[str]]:
    if not is_legacy(src):
        raise GGUFFormatError(
            f"{src.path}: {General.ARCHITECTURE} is {src.architecture!r}, not the legacy {LEGACY_ARCH!r}")
    src.general()  # typed: a name or license with a control character is refused, not carried over
    typed = legacy_values(src)
    facts = describe(src).facts()  # the same values, now known to be well typed (HF numbering)
    warnings = check_fits_target(facts, target) if target else []
    fc = src.tensors.get("dflash_fc.weight") or src.tensors.get("fc.weight")
    n_features = src.get(Legacy.N_TARGET_FEATURES)
    if n_features is not None:
        n_features = values.integer(src.path, Legacy.N_TARGET_FEATURES, n_features, 1, None, GGUFFormatError)
    if fc is not None and n_features is not None and fc.shape[-1] != n_features:
        raise GGUFFormatError(
            f"{src.path}: n_target_features {n_features} does not match dflash_fc.weight width {fc.shape[-1]}")

    new = gguf.GGUFWriter(path=None, arch=ARCH)
    if Legacy.BLOCK_SIZE in typed:
        new.add_uint32(DFlash.BLOCK_SIZE, typed[Legacy.BLOCK_SIZE])
    new.add_array(DFlash.TARGET_LAYERS, [i + 1 for i in typed[Legacy.TARGET_LAYER_IDS]])
    if Legacy.MASK_TOKEN_ID in typed:
        new.add_mask_token_id(typed[Legacy.MASK_TOKEN_ID])

    plan = GGUFPlan()
    for key, kv in src.kv.items():
        if key.startswith(Legacy.NESTED) or key in (General.ARCHITECTURE, Tokenizer.MASK_ID):
            continue
        if key.startswith(Legacy.PREFIX):
            kv = type(kv)(f"{ARCH}.{key[len(Legacy.PREFIX):]}", kv.type, kv.value, kv.sub_type, kv.raw)
        plan.add_kv([kv])
    plan.kv.insert(0, kv_from_writer(new)[0])  # general.architecture first, as in every GGUF
    plan.add_kv(kv_from_writer(new)[1:])
    renamed: dict[str, str] = {}
    for name, info in src.tensors.items():
        new_name = layout.LEGACY_TENSOR_RENAMES.get(name, name)
        if new_name in renamed:
            raise GGUFFormatError(f"{src.path}: tensors {renamed[new_name]!r} and {name!r} both become {new_name!r} "
                                  "in the mainline layout; the legacy file holds the tensor twice: it cannot be migrated")
        renamed[new_name] = name
        plan.tensors.append(PlannedTensor(TensorInfo(new_name, info.shape, info.type), _copy(src, name)))
    variant = next((v for marker, v in layout.VARIANT_MARKERS.items() if marker in renamed), layout.DFLASH)
    wanted = [rule.gguf_name(bid) for rule, bid in layout.expected_tensors(variant, typed[Legacy.BLOCK_COUNT])]
    missing = [name for name in wanted if name not in renamed]
    if missing:
        legacy_names = {new: old for old, new in layout.LEGACY_TENSOR_RENAMES.items()}
        spelled = ", ".join(legacy_names.get(n, n) for n in missing[:4]) + (" ..." if len(missing) > 4 else "")
        raise GGUFFormatError(f"{src.path}: tensor(s) {spelled} missing for {typed[Legacy.BLOCK_COUNT]} layers; "
                              "the legacy file is incomplete: it cannot be migrated")
    return plan, warnings


def migrate(src_path: str | Path, out: str | Path, target: TargetInfo | None = None, progress=None) -> list[str]:
    with GGUFFile(src_path) as src:
        plan, warnings = plan_migration(src, target)
        write_gguf(plan, Path(out), progress)
    return warnings
