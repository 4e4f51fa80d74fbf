"""Migrate a legacy fork GGUF (`general.architecture = dflash-draft`) to the mainline layout.

Tensor bytes are copied untouched; only names and metadata change: nested
`dflash-draft.dflash.*` keys become mainline keys, target layer ids are shifted by one (mainline taps
the *input* of layer L), and `dflash_fc` / `dflash_hidden_norm` get their mainline names.
"""

from __future__ import annotations

from pathlib import Path
import gguf

from .. import values
from ..errors import GGUFFormatError
from .config_values import MAX_BLOCK_SIZE
from . import layout
from .compat import DrafterFacts, check_fits_target
from .describe import describe
from .gguf_file import FileSpan, GGUFFile, GGUFPlan, PlannedTensor, TensorInfo, kv_from_writer, write_gguf
from .keys import ARCH, LEGACY_ARCH, DFlash, General, Legacy, Tokenizer
from .target import TargetInfo


def is_legacy(gguf_file: GGUFFile) -> bool:
    return gguf_file.architecture == LEGACY_ARCH


def legacy_facts(src: GGUFFile) -> DrafterFacts:
    """What the compatibility rules need, from a legacy file (ids stay in the HF numbering there)."""
    for key in (Legacy.TARGET_LAYER_IDS, Legacy.EMBEDDING_LENGTH):
        if key not in src.kv:
            raise GGUFFormatError(f"{src.path}: legacy DFlash file lacks {key!r}; it cannot be migrated")
    return describe(src).facts()


def _copy(src: GGUFFile, name: str):
    info = src.tensors[name]
    return lambda: [FileSpan(src.path, src.data_offset + info.offset, info.nbytes, src.opened_file)]


def plan_migration(src: GGUFFile, target: TargetInfo | None = None) -> tuple[GGUFPlan, list[str]]:
    if not is_legacy(src):
        raise GGUFFormatError(
            f"{src.path}: {General.ARCHITECTURE} is {src.architecture!r}, not the legacy {LEGACY_ARCH!r}")
    facts = legacy_facts(src)
    warnings = check_fits_target(facts, target) if target else []
    fc = src.tensors.get("dflash_fc.weight") or src.tensors.get("fc.weight")
    n_features = src.get(Legacy.N_TARGET_FEATURES)
    if fc is not None and n_features is not None and fc.shape[-1] != n_features:
        raise GGUFFormatError(
            f"{src.path}: n_target_features {n_features} does not match dflash_fc.weight width {fc.shape[-1]}")

    new = gguf.GGUFWriter(path=None, arch=ARCH)
    if (block_size := src.get(Legacy.BLOCK_SIZE)) is not None:
        new.add_uint32(DFlash.BLOCK_SIZE, values.integer(src.path, Legacy.BLOCK_SIZE, block_size, 2, MAX_BLOCK_SIZE,
                                                         GGUFFormatError))
    new.add_array(DFlash.TARGET_LAYERS, [i + 1 for i in facts.target_layer_ids])
    if facts.mask_token_id is not None:
        new.add_mask_token_id(int(facts.mask_token_id))

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
    return plan, warnings


def migrate(src_path: str | Path, out: str | Path, target: TargetInfo | None = None, progress=None) -> list[str]:
    with GGUFFile(src_path) as src:
        plan, warnings = plan_migration(src, target)
        write_gguf(plan, Path(out), progress)
    return warnings
