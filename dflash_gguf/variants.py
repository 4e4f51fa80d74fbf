"""The drafter variants, as one table (as gguf-py keeps `MODEL_ARCH` with one `MODEL_ARCH_NAMES`).

Each variant's row says how it is named, which config.json `architectures` declare it (in the pinned
converter's order), the PyTorch reference class that runs it (its name is what `train` writes), the
prefix of its release files, the tensor that tells it apart in a mainline GGUF, llama-server's
--spec-type, the block size `dflash-gguf train` gives it and the `dflash_config` fields it adds to
DFlash's. gguf/layout.py, gguf/describe.py, train/, validation/reference.py and the fixtures read it;
no module outside this one spells a class name (tests/base/test_variants.py holds it).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Variant(StrEnum):
    DFLASH = "dflash"
    DFLASH2 = "dflash2"
    DSPARK = "dspark"
    LEGACY = "legacy"  # the legacy fork's GGUFs (convert/legacy.py migrates them): no checkpoint, no class


@dataclass(frozen=True)
class VariantRow:
    title: str                               # how messages, cards and `inspect` name it
    architectures: tuple[str, ...] = ()      # config.json `architectures` values that declare it
    reference_class: str | None = None       # the reference's class (one of architectures): what train writes
    reference_module: str | None = None      # where that class lives (extra: [reference])
    file_prefix: str | None = None           # release files' names start with it (llama.cpp's drafter discovery)
    marker: str | None = None                # a tensor only this variant's mainline GGUF has
    spec_type: str | None = None             # llama-server's --spec-type
    block_size: int | None = None            # `dflash-gguf train`'s default; None: train does not make it
    config_fields: tuple[str, ...] = ()      # settings beyond DFlash's (dflash_config or the top level)


_ZLAB = "dflash.model"  # the z-lab reference (PyPI `dflash`)

VARIANTS: dict[Variant, VariantRow] = {
    Variant.DFLASH: VariantRow(
        "DFlash", ("DFlashDraftModel",), "DFlashDraftModel", _ZLAB, "dflash", None, "draft-dflash", 16),
    # DFlash 2: grouped dynamic causal convolutions and a candidate selector (selector_* only it has)
    Variant.DFLASH2: VariantRow(
        "DFlash 2", ("DFlash2DraftModel",), "DFlash2DraftModel", _ZLAB, "dflash", "selector_hidden.weight",
        "draft-dflash", 8, ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")),
    # DSpark (DFlash + a Markov head): every name the pinned converter registers for it; z-lab does not
    # model it, validation/dspark_reference.py does
    Variant.DSPARK: VariantRow(
        "DSpark", ("Qwen3DSparkModel", "DSparkDraftModel", "DSparkSpeculator", "Lfm2DSparkDraftModel",
                   "LingDSparkModel"),
        "DSparkDraftModel", "dflash_gguf.validation.dspark_reference", "dspark", "markov_w1.weight",
        "draft-dspark", None, ("markov_rank",)),
    Variant.LEGACY: VariantRow("legacy fork"),
}

# config.json `architectures` value -> its variant
ARCHITECTURES: dict[str, Variant] = {arch: v for v, row in VARIANTS.items() for arch in row.architectures}


def architecture(variant: str) -> str:
    """The class name a config.json of this variant names (what train and the fixtures write)."""
    name = VARIANTS[Variant(variant)].reference_class
    if name is None:
        raise ValueError(f"{variant}: no checkpoint class")
    return name
