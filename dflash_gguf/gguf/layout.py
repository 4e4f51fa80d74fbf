"""The HF -> GGUF correspondence for DFlash drafters, as data.

One row per tensor: its name in a z-lab checkpoint, its name in the mainline llama.cpp GGUF, the
shape the checkpoint must have, and the variants that carry it. The converter, the inspector and the
legacy migration all read this table; adding a drafter variant means adding rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..variants import ARCHITECTURES, VARIANTS, Variant

DFLASH, DFLASH2, DSPARK, LEGACY = Variant.DFLASH, Variant.DFLASH2, Variant.DSPARK, Variant.LEGACY

VARIANT_NAMES = {v: row.title for v, row in VARIANTS.items()}

# The file-name prefix of each variant's release files: what llama.cpp's `-hf` drafter discovery and
# --models-dir mode look for.
FILE_PREFIXES = {v: row.file_prefix for v, row in VARIANTS.items() if row.file_prefix}


def is_drafter_file(name: str) -> bool:
    """A drafter GGUF named as releases name them: a known prefix and `.gguf`."""
    return name.endswith(".gguf") and name.startswith(tuple(f"{p}-" for p in sorted(set(FILE_PREFIXES.values()))))


# Tensors whose presence tells the variants of a mainline GGUF apart (as the pinned
# common/speculative.cpp tells draft-dspark from draft-dflash).
VARIANT_MARKERS = {row.marker: v for v, row in VARIANTS.items() if row.marker}


@dataclass(frozen=True)
class Geometry:
    """The sizes a drafter's tensor shapes are made of."""

    hidden: int
    n_head: int
    n_head_kv: int
    head_dim: int
    ffn: int
    n_taps: int
    vocab: int
    conv_kernel: int = 0
    conv_groups: int = 0
    selector_rank: int = 0
    markov_rank: int = 0
    draft_vocab: int = 0


@dataclass(frozen=True)
class TensorRule:
    hf: str  # name in the checkpoint ("{bid}" is the layer index), without any "model." prefix
    gguf: str  # name in the GGUF
    shape: Callable[[Geometry], tuple[int, ...]]
    variants: frozenset[str]
    per_layer: bool = False
    optional: bool = False  # written when the checkpoint has it (attention sinks and biases)

    def hf_name(self, bid: int | None = None) -> str:
        return self.hf.format(bid=bid)

    def gguf_name(self, bid: int | None = None) -> str:
        return self.gguf.format(bid=bid)


_ALL = frozenset({DFLASH, DFLASH2, DSPARK})  # every variant built on the DFlash layers
_V2 = frozenset({DFLASH2})
_DSPARK = frozenset({DSPARK})


def _row(hf, gguf, shape, variants=_ALL, optional=False):
    return TensorRule(hf, gguf, shape, variants, per_layer="{bid}" in hf, optional=optional)


# A Qwen3 decoder layer: the drafter's layers and the target's have the same rows.
_DECODER_LAYER = (
    ("input_layernorm.weight", "attn_norm.weight", lambda g: (g.hidden,)),
    ("self_attn.q_proj.weight", "attn_q.weight", lambda g: (g.n_head * g.head_dim, g.hidden)),
    ("self_attn.k_proj.weight", "attn_k.weight", lambda g: (g.n_head_kv * g.head_dim, g.hidden)),
    ("self_attn.v_proj.weight", "attn_v.weight", lambda g: (g.n_head_kv * g.head_dim, g.hidden)),
    ("self_attn.o_proj.weight", "attn_output.weight", lambda g: (g.hidden, g.n_head * g.head_dim)),
    ("self_attn.q_norm.weight", "attn_q_norm.weight", lambda g: (g.head_dim,)),
    ("self_attn.k_norm.weight", "attn_k_norm.weight", lambda g: (g.head_dim,)),
    ("post_attention_layernorm.weight", "ffn_norm.weight", lambda g: (g.hidden,)),
    ("mlp.gate_proj.weight", "ffn_gate.weight", lambda g: (g.ffn, g.hidden)),
    ("mlp.up_proj.weight", "ffn_up.weight", lambda g: (g.ffn, g.hidden)),
    ("mlp.down_proj.weight", "ffn_down.weight", lambda g: (g.hidden, g.ffn)),
)


def _layer_rows(hf_prefix: str, variants=_ALL) -> tuple[TensorRule, ...]:
    return tuple(_row(f"{hf_prefix}layers.{{bid}}.{hf}", f"blk.{{bid}}.{gguf}", shape, variants)
                 for hf, gguf, shape in _DECODER_LAYER)


# Optional attention biases (attention_bias: true, z-lab gpt-oss-*-DFlash); ggml_patches/0004 makes the
# dflash graph load and apply them. A checkpoint has all of them or none.
ATTENTION_BIASES: tuple[TensorRule, ...] = (
    _row("layers.{bid}.self_attn.q_proj.bias", "blk.{bid}.attn_q.bias", lambda g: (g.n_head * g.head_dim,), _ALL, True),
    _row("layers.{bid}.self_attn.k_proj.bias", "blk.{bid}.attn_k.bias", lambda g: (g.n_head_kv * g.head_dim,), _ALL, True),
    _row("layers.{bid}.self_attn.v_proj.bias", "blk.{bid}.attn_v.bias", lambda g: (g.n_head_kv * g.head_dim,), _ALL, True),
    _row("layers.{bid}.self_attn.o_proj.bias", "blk.{bid}.attn_output.bias", lambda g: (g.hidden,), _ALL, True),
)

TENSORS: tuple[TensorRule, ...] = (
    _row("fc.weight", "fc.weight", lambda g: (g.hidden, g.n_taps * g.hidden)),
    _row("hidden_norm.weight", "enc.output_norm.weight", lambda g: (g.hidden,)),
    _row("norm.weight", "output_norm.weight", lambda g: (g.hidden,)),
    *_layer_rows(""),
    # DFlash 2: grouped dynamic causal convolutions and the candidate selector.
    _row("layers.{bid}.attention_conv.base_kernel", "blk.{bid}.attn_conv_base",
         lambda g: (2, g.conv_kernel, g.hidden), _V2),
    _row("layers.{bid}.attention_conv.kernel_projection.weight", "blk.{bid}.attn_conv_proj.weight",
         lambda g: (2 * g.conv_kernel * g.conv_groups, g.hidden), _V2),
    _row("layers.{bid}.mlp_conv.base_kernel", "blk.{bid}.ffn_conv_base",
         lambda g: (2, g.conv_kernel, g.hidden), _V2),
    _row("layers.{bid}.mlp_conv.kernel_projection.weight", "blk.{bid}.ffn_conv_proj.weight",
         lambda g: (2 * g.conv_kernel * g.conv_groups, g.hidden), _V2),
    _row("candidate_selector.predecessor_codebook", "selector_predecessor.weight",
         lambda g: (g.vocab, g.selector_rank), _V2),
    _row("candidate_selector.successor_codebook", "selector_successor.weight",
         lambda g: (g.vocab, g.selector_rank), _V2),
    _row("candidate_selector.hidden_projection.weight", "selector_hidden.weight",
         lambda g: (g.selector_rank, g.hidden), _V2),
    # DSpark: the Markov head (markov_w1 an embedding of the previous token, markov_w2 its bias
    # projection onto the draft vocabulary), the optional confidence head, and for a reduced draft
    # vocabulary its own output head (d2t, its map to target ids, is written by the converter).
    _row("markov_head.markov_w1.weight", "markov_w1.weight", lambda g: (g.vocab, g.markov_rank), _DSPARK),
    _row("markov_head.markov_w2.weight", "markov_w2.weight", lambda g: (g.draft_vocab, g.markov_rank), _DSPARK),
    _row("confidence_head.proj.weight", "conf_proj.weight", lambda g: (1, g.hidden + g.markov_rank), _DSPARK, True),
    _row("confidence_head.proj.bias", "conf_proj.bias", lambda g: (1,), _DSPARK, True),
    _row("lm_head.weight", "output.weight", lambda g: (g.draft_vocab, g.hidden), _DSPARK, True),
    *ATTENTION_BIASES,
    # Optional per-head attention sinks, under the names publishers give them; the pinned dflash
    # graph loads blk.N.attn_sinks.weight when present.
    *(_row(f"layers.{{bid}}.self_attn.{hf}", "blk.{bid}.attn_sinks.weight", lambda g: (g.n_head,), _ALL, True)
      for hf in ("sinks",  # gpt-oss, Nemotron
                 "attention_sink_bias",  # MiMo
                 "learnable_sink_param")),  # Hunyuan V4
)

# The target side: a Qwen3ForCausalLM (what `make fixtures` converts for the trained pair) and a
# LlamaForCausalLM (the same rows without the q/k norms; what training/hf_from_gguf.py derives from
# the SmolLM2 target's GGUF).
QWEN3 = "qwen3"
QWEN3_TIED = "qwen3-tied"
LLAMA = "llama"
LLAMA_TIED = "llama-tied"
_Q3 = frozenset({QWEN3, QWEN3_TIED})
_TARGETS = _Q3 | {LLAMA, LLAMA_TIED}
_QK_NORMS = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")
TARGET_TENSORS: tuple[TensorRule, ...] = (
    _row("model.embed_tokens.weight", "token_embd.weight", lambda g: (g.vocab, g.hidden), _TARGETS),
    _row("model.norm.weight", "output_norm.weight", lambda g: (g.hidden,), _TARGETS),
    _row("lm_head.weight", "output.weight", lambda g: (g.vocab, g.hidden), frozenset({QWEN3, LLAMA})),
    *(_row(f"model.layers.{{bid}}.{hf}", f"blk.{{bid}}.{gguf}", shape, _Q3 if hf in _QK_NORMS else _TARGETS)
      for hf, gguf, shape in _DECODER_LAYER),
)

# Checkpoint names that carry nothing llama.cpp needs.
IGNORED_HF_SUFFIXES = (".rotary_emb.inv_freq", ".attention.masked_bias", ".attention.bias")

# Names some exports use for the same tensor (transformers' key_mapping for nn.Embedding codebooks).
HF_ALIASES = {
    "candidate_selector.predecessor_codebook.weight": "candidate_selector.predecessor_codebook",
    "candidate_selector.successor_codebook.weight": "candidate_selector.successor_codebook",
}

# The legacy fork's tensor names that differ from mainline; everything else is already mainline.
LEGACY_TENSOR_RENAMES = {
    "dflash_fc.weight": "fc.weight",
    "dflash_hidden_norm.weight": "enc.output_norm.weight",
}


def normalize_hf_name(name: str) -> str:
    """A drafter tensor's name as the table spells it (exports differ in prefix and suffix)."""
    name = name.removeprefix("model.")
    return HF_ALIASES.get(name, name)


def expected_tensors(variant: str, n_layers: int, table: tuple[TensorRule, ...] = TENSORS,
                     present: frozenset[str] | set[str] = frozenset()) -> list[tuple[TensorRule, int | None]]:
    """Every (rule, layer) a model of this variant must have, in writing order, plus the optional
    ones whose checkpoint name is in `present`."""
    def wanted(rule: TensorRule, bid: int | None) -> bool:
        return variant in rule.variants and (not rule.optional or rule.hf_name(bid) in present)

    out: list[tuple[TensorRule, int | None]] = []
    for rule in table:
        if not rule.per_layer and wanted(rule, None):
            out.append((rule, None))
    for bid in range(n_layers):
        for rule in table:
            if rule.per_layer and wanted(rule, bid):
                out.append((rule, bid))
    return out


def keeps_f32(gguf_name: str, n_dims: int) -> bool:
    """Tensors upstream always writes as F32: 1-D tensors, norms, and names without `.weight`."""
    return n_dims <= 1 or gguf_name.endswith("_norm.weight") or not gguf_name.endswith(".weight")
