"""Every config.json field the converter reads, declared once with its type and range (the typed
reader, dflash_gguf/typed_reader.py, applies the rules): a wrong type or an absurd value ends in one line
naming the file and the field, exit 2, never a traceback nor a GGUF that llama.cpp then mishandles.

    read(source, "rope_theta", value)     the declared field, CheckpointError when the value is off

Ranges are what llama.cpp and the GGUF field hold (u32 counts, f32 floats), tightened where a
larger value is no drafter (MAX_SIZE, MAX_VOCAB, MAX_BLOCK_SIZE): beyond them llama.cpp fails
(bad_alloc) or the numbers are garbage. The primitives (`integer`, `number`, ...) serve a value
whose range depends on another field.
"""

from __future__ import annotations

from typing import Any

from .. import typed_reader as v
from ..errors import CheckpointError, DflashError
from ..typed_reader import Field

MAX_SIZE = 1 << 20          # hidden, ffn, head counts
MAX_VOCAB = 1 << 24
MAX_BLOCK_SIZE = 1024       # block_size 0 or 1 drafts nothing; 10^9 made llama-server answer bad_alloc
MAX_CONTEXT = 1 << 31
MAX_LAYERS = 1 << 12        # a drafter has a few layers, a target a few hundred at most


def _fields(*fields: Field) -> dict[str, Field]:
    return {f.name: f for f in fields}


FIELDS = _fields(
    # sizes
    Field("hidden_size", "int", 1, MAX_SIZE), Field("num_hidden_layers", "int", 1, MAX_LAYERS),
    Field("vocab_size", "int", 1, MAX_VOCAB), Field("num_attention_heads", "int", 1, MAX_SIZE),
    Field("intermediate_size", "int", 1, MAX_SIZE), Field("head_dim", "int", 1, MAX_SIZE),
    Field("num_key_value_heads", "int", 1, MAX_SIZE), Field("num_target_layers", "int", 1, MAX_LAYERS),
    Field("max_position_embeddings", "int", 1, MAX_CONTEXT),
    Field("original_max_position_embeddings", "int", 1, MAX_CONTEXT),
    Field("num_local_experts", "int", 1, MAX_SIZE), Field("num_experts_per_tok", "int", 1, MAX_SIZE),
    # the DFlash block and its layers
    Field("block_size", "int", 2, MAX_BLOCK_SIZE), Field("mask_token_id", "int", 0, MAX_VOCAB),
    Field("target_layer_ids", "int-list", 0, MAX_LAYERS - 1),
    Field("aux_hidden_state_layer_ids", "int-list", 1, MAX_LAYERS),
    Field("conv_kernel_size", "int", 1, MAX_SIZE), Field("conv_group_size", "int", 1, MAX_SIZE),
    Field("selector_rank", "int", 1, MAX_SIZE), Field("selector_top_k", "int", 1, MAX_SIZE),
    # floats (all written as f32)
    Field("rope_theta", "float", positive=True), Field("rms_norm_eps", "float", positive=True, hi=1.0),
    Field("partial_rotary_factor", "float", positive=True, hi=1.0),
    Field("rope_scaling.factor", "float", positive=True),
    Field("rope_scaling.extrapolation_factor", "float"), Field("rope_scaling.attention_factor", "float"),
    Field("rope_scaling.beta_fast", "float"), Field("rope_scaling.beta_slow", "float"),
    Field("attention_value_scale", "float"), Field("output_multiplier", "float"),
    Field("final_logit_softcapping", "float"), Field("input_embedding_scale", "float"),
    # switches
    Field("is_causal", "bool"), Field("dflash_config.causal", "bool"), Field("dflash_config.use_swa", "bool"),
    Field("use_sliding_window", "bool"), Field("attention_bias", "bool"), Field("rope_is_neox_style", "bool"),
    Field("tie_word_embeddings", "bool"),
    # sliding window
    Field("dflash_config.swa_window_size", "int", 1, MAX_CONTEXT), Field("sliding_window", "int", 1, MAX_CONTEXT),
    # the kinds llama.cpp's DFlash graph runs; another (chunked_attention, ...) would run as full attention
    Field("layer_types", "str-list", choices=("full_attention", "sliding_attention")),
    # names and nested objects
    Field("architectures", "str-list"), Field("rope_scaling.rope_type", "str", hi=64),
    Field("_name_or_path", "str", hi=1024),
    Field("dflash_config", "object"), Field("transformer_layer_config", "object"), Field("text_config", "object"),
    Field("rope_scaling", "object"), Field("rope_parameters", "object"), Field("quantization_config", "object"),
    # DSpark
    Field("draft_vocab_size", "int", 1, MAX_VOCAB), Field("sample_from_anchor", "bool"),
    Field("markov_head_type", "str", hi=64),
    # quantization_config (FP8 exports)
    Field("quantization_config.quant_method", "str", hi=64), Field("quantization_config.fmt", "str", hi=64),
    Field("quantization_config.format", "str", hi=64),
    Field("quantization_config.weight_block_size", "int-list", 1, MAX_SIZE),
    Field("quantization_config.config_groups", "object"),
    Field("quantization_config.config_groups.weights", "object"),
    Field("quantization_config.config_groups.weights.type", "str", hi=64),
    Field("quantization_config.config_groups.weights.num_bits", "int", 1, 64),
    Field("quantization_config.config_groups.weights.block_structure", "int-list", 1, MAX_SIZE),
    Field("quantization_config.config_groups.weights.group_size", "int", 1, MAX_SIZE),
)


# A target GGUF's facts ("{arch}.block_count", ...) are the config.json fields they were converted from,
# held to the same ranges (a block_count of 2**63 is no model).
TARGET_GGUF = {"block_count": "num_hidden_layers", "embedding_length": "hidden_size", "vocab_size": "vocab_size"}


def read_target_gguf(source: object, key: str, value: Any, error: type[DflashError] = CheckpointError) -> int:
    """The target GGUF's `key` ("{arch}.block_count", ...), checked as its config.json field is."""
    field = FIELDS[TARGET_GGUF[key.rsplit(".", 1)[-1]]]
    return v.integer(source, key, value, field.lo, field.hi, error)


def read(source: object, name: str, value: Any, default: Any = None,
         error: type[DflashError] = CheckpointError) -> Any:
    """The declared field `name` (see FIELDS) checked; `default` when the value is absent (None)."""
    return FIELDS[name].read(source, value, error, default)


# -- the primitives, failing with CheckpointError unless told otherwise --------------------------------------

def integer(source: object, name: str, value: Any, lo: int | None = 1, hi: int | None = v.U32_MAX,
            error: type[DflashError] = CheckpointError) -> int:
    return v.integer(source, name, value, lo, hi, error)


def optional_integer(source: object, name: str, value: Any, lo: int | None = 1, hi: int | None = v.U32_MAX,
                     error: type[DflashError] = CheckpointError) -> int | None:
    return None if value is None else v.integer(source, name, value, lo, hi, error)


def number(source: object, name: str, value: Any, *, error: type[DflashError] = CheckpointError, **bounds) -> float:
    return v.number(source, name, value, error=error, **bounds)


def optional_number(source: object, name: str, value: Any, **kwargs) -> float | None:
    return None if value is None else number(source, name, value, **kwargs)


def boolean(source: object, name: str, value: Any, error: type[DflashError] = CheckpointError) -> bool:
    return v.boolean(source, name, value, error)


def optional_boolean(source: object, name: str, value: Any, error: type[DflashError] = CheckpointError) -> bool | None:
    return None if value is None else v.boolean(source, name, value, error)


def mapping(source: object, name: str, value: Any, error: type[DflashError] = CheckpointError) -> dict:
    return v.mapping(source, name, value, error)


def string_list(source: object, name: str, value: Any, error: type[DflashError] = CheckpointError) -> list[str]:
    return v.string_list(source, name, value, error)
