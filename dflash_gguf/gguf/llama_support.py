"""Which llama.cpp runs a drafter GGUF: stock llama.cpp, or a build with one of our patches.

One table, measured: each row is a feature a converted file can carry, told by its tensors, with
the patch of ggml_patches/ a build needs to run it (None: stock llama.cpp runs it) and, for those,
what stock llama.cpp says when it refuses the file. tests/runner/test_stock_llama.py runs every family the
converter writes in stock llama.cpp (PyPI xllamacpp, the version in STOCK_MEASURED) beside the
patched build and fails when stock behaves otherwise than this table says. The model card
(release/card.py), `inspect` and `release`'s warning all read `support()`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..variants import VARIANTS

# The stock build the table was measured on (and the `test-stock` extra pins).
STOCK_MEASURED = "xllamacpp==2026.10.11549"

# How a variant is named where a build supports it, and the --spec-type it runs with.
VARIANT_SUPPORT = {v: row.title for v, row in VARIANTS.items() if row.spec_type}


@dataclass(frozen=True)
class Feature:
    key: str
    name: str                  # what the file carries, in a user's words
    tensors: str               # a regular expression over tensor names: the file has it when one matches
    patch: str | None = None   # the ggml_patches/ file a build needs to run it; None: stock runs it
    stock_refusal: str | None = None  # what stock llama.cpp's log says when it refuses the file

    @property
    def patch_number(self) -> str | None:
        return self.patch.split("-", 1)[0] if self.patch else None

    @property
    def patch_label(self) -> str | None:
        """"attention-bias patch (0004)" for 0004-dflash-attention-bias.patch."""
        if not self.patch:
            return None
        words = self.patch.removesuffix(".patch").split("-")[1:]
        words = words[1:] if words and words[0] == "dflash" else words
        return f"{'-'.join(words)} patch ({self.patch_number})"


FEATURES: tuple[Feature, ...] = (
    Feature("attention-sinks", "attention sinks", r"^blk\.\d+\.attn_sinks\.weight$"),
    Feature("mask-embedding", "its own mask embedding", r"^token_embd\.weight$"),
    Feature("reduced-vocabulary", "a reduced draft vocabulary", r"^d2t$"),
    Feature("attention-bias", "attention biases", r"^blk\.\d+\.attn_(q|k|v|output)\.bias$",
            patch="0004-dflash-attention-bias.patch", stock_refusal="wrong number of tensors"),
)


@dataclass(frozen=True)
class Support:
    """Which llama.cpp runs one file."""

    variant: str | None
    features: tuple[Feature, ...]   # the table's features the file carries

    @property
    def patches(self) -> tuple[Feature, ...]:
        return tuple(f for f in self.features if f.patch)

    @property
    def stock(self) -> bool:
        """Whether stock llama.cpp (with support for this variant) runs the file."""
        return self.variant in VARIANT_SUPPORT and not self.patches

    @property
    def text(self) -> str:
        """"stock llama.cpp with DFlash 2 support", or "needs a build with dflash-gguf's
        attention-bias patch (0004)"."""
        if self.variant not in VARIANT_SUPPORT:
            return "no llama.cpp runs it: not a DFlash drafter of mainline's layout"
        if self.stock:
            return f"stock llama.cpp with {VARIANT_SUPPORT[self.variant]} support"
        labels = " and ".join(f.patch_label for f in self.patches)
        return f"needs a build with dflash-gguf's {labels}"

    @property
    def why(self) -> str | None:
        """What stock llama.cpp does with the file when it cannot run it."""
        if self.stock or not self.patches:
            return None
        return "; ".join(f"its {f.name} make stock llama.cpp refuse it (\"{f.stock_refusal}\")" for f in self.patches)

    def to_dict(self) -> dict:
        return {"stock": self.stock, "text": self.text, "features": [f.key for f in self.features],
                "patches": [f.patch for f in self.patches], "measured_on": STOCK_MEASURED}


def support(variant: str | None, tensor_names) -> Support:
    names = list(tensor_names)
    found = tuple(f for f in FEATURES if any(re.match(f.tensors, n) for n in names))
    return Support(variant, found)


def support_of(desc) -> Support:
    """support() of a DrafterDescription (dflash_gguf/gguf/describe.py)."""
    return support(desc.variant, (t.name for t in desc.tensors))
