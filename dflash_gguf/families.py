"""The target families published DFlash drafters serve: one row per `general.architecture`.

A row holds what the project knows about a family: the transformers classes a tiny target is built
from, its geometry at toy width (layer types and their pattern, windows, recurrent heads, experts,
partial rotary and rope sections, embedding scale, soft-capping), the GGUF keys its targets must
carry for a drafter to run as published, which target layers published drafters tap, and what
keeps a family from being built or served here; which architectures' graphs record the layer inputs
a drafter reads, and the families that cannot serve DFlash with the reason. The zoo
(tests/fixtures/families.py), the converter's target checks and `doctor` read this table; nothing
else spells these facts.
"""

from __future__ import annotations

from dataclasses import dataclass

_SLIDING, _FULL, _LINEAR = "sliding_attention", "full_attention", "linear_attention"

# Toy width every family shares, so that one tokenizer and one drafter shape fit them all.
TOY_HIDDEN = 64
TOY_HEADS, TOY_KV_HEADS, TOY_HEAD_DIM = 4, 2, 16
TOY_FFN = 128
TOY_EXPERTS, TOY_EXPERTS_USED, TOY_EXPERT_FFN = 4, 2, 32
TOY_WINDOW = 16  # sliding window: short enough that the held-out prompts run past it


@dataclass(frozen=True)
class DrafterGeometry:
    """What the published drafters of a family look like (z-lab and others, FACTS.md s.6)."""

    block_size: int
    num_layers: int
    sliding_window: bool = False  # the published drafter's layers use a sliding window


@dataclass(frozen=True)
class Family:
    arch: str                   # the target GGUF's general.architecture
    hf_architecture: str        # config.json `architectures[0]` the pinned converter registers
    config_class: str           # transformers' own config class
    toy: dict                   # config overrides at toy width (the family's geometry, scaled down)
    published: tuple[str, ...]  # published drafters for targets of this family
    dflash: DrafterGeometry = DrafterGeometry(block_size=16, num_layers=2)
    dflash2: DrafterGeometry = DrafterGeometry(block_size=8, num_layers=2, sliding_window=True)
    # for a multimodal family whose text model the converter reads from the whole model's folder:
    # the vision tower's config at toy size (`toy` is then the text config)
    vision_toy: dict | None = None
    # the toy's tokenizer: "qwen3" (Qwen3's BPE; its pre-tokenizer hash the converter knows) or
    # "sentencepiece-bpe" (a byte-fallback BPE, which the converter reads without a hash: Gemma 4)
    tokenizer: str = "qwen3"
    recurrent: bool = False     # llama-server rolls rejected drafts back through checkpoints
    sliding: bool = False       # the target has sliding-window layers
    # GGUF keys (without the `<arch>.` prefix) a target of this family carries that a drafter's
    # run depends on; doctor names a target that lacks one
    target_keys: tuple[str, ...] = ()
    convert_args: tuple[str, ...] = ()  # extra arguments the pinned upstream converter needs
    limitation: str | None = None       # why the zoo cannot build or serve it (the exact error)
    notes: str = ""

    @property
    def num_layers(self) -> int:
        return self.toy["num_hidden_layers"]

    def tapped_layers(self, num_draft_layers: int) -> list[int]:
        """Target layers a drafter with `num_draft_layers` layers taps, spread as the published
        drafters spread them (the reference's `build_target_layer_ids`)."""
        n = self.num_layers
        if num_draft_layers == 1:
            return [n // 2]
        start, end = 1, n - 3
        return [round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def _attention(**extra) -> dict:
    return {"hidden_size": TOY_HIDDEN, "num_attention_heads": TOY_HEADS,
            "num_key_value_heads": TOY_KV_HEADS, "head_dim": TOY_HEAD_DIM,
            "intermediate_size": TOY_FFN, "max_position_embeddings": 4096, **extra}


def _pattern(unit: list[str], repeats: int) -> list[str]:
    return unit * repeats


# Qwen3.5 / 3.6 / 3.8: three Gated DeltaNet layers, then one full-attention layer; partial rotary
# (a quarter of the head) with interleaved multimodal rope sections.
_QWEN35_LINEAR = {
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4,
}
_QWEN35_ROPE = {"rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25, "rope_type": "default",
                "mrope_section": [1, 1, 0], "mrope_interleaved": True}

FAMILIES: dict[str, Family] = {f.arch: f for f in (
    Family(
        arch="qwen35", hf_architecture="Qwen3_5ForCausalLM", config_class="Qwen3_5TextConfig",
        toy=_attention(num_hidden_layers=8, layer_types=_pattern([_LINEAR] * 3 + [_FULL], 2),
                       head_dim=32, rope_parameters=_QWEN35_ROPE, tie_word_embeddings=True,
                       **_QWEN35_LINEAR),
        published=("z-lab/Qwen3.5-4B-DFlash", "z-lab/Qwen3.6-27B-DFlash", "z-lab/Qwen3.8-27B-DFlash2"),
        recurrent=True, target_keys=("rope.dimension_sections",), convert_args=("--no-mtp",),
    ),
    Family(
        arch="qwen35moe", hf_architecture="Qwen3_5MoeForCausalLM", config_class="Qwen3_5MoeTextConfig",
        toy=_attention(num_hidden_layers=8, layer_types=_pattern([_LINEAR] * 3 + [_FULL], 2),
                       head_dim=32, rope_parameters=_QWEN35_ROPE, tie_word_embeddings=True,
                       num_experts=TOY_EXPERTS, num_experts_per_tok=TOY_EXPERTS_USED,
                       moe_intermediate_size=TOY_EXPERT_FFN, shared_expert_intermediate_size=TOY_EXPERT_FFN,
                       **_QWEN35_LINEAR),
        published=("z-lab/Qwen3.5-35B-A3B-DFlash", "z-lab/Qwen3.6-35B-A3B-DFlash"),
        recurrent=True, target_keys=("rope.dimension_sections",), convert_args=("--no-mtp",),
    ),
    Family(
        arch="qwen3next", hf_architecture="Qwen3NextForCausalLM", config_class="Qwen3NextConfig",
        toy=_attention(num_hidden_layers=8, layer_types=_pattern([_LINEAR] * 3 + [_FULL], 2),
                       head_dim=32, tie_word_embeddings=True,
                       rope_parameters={"rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                                        "rope_type": "default"},
                       num_experts=TOY_EXPERTS, num_experts_per_tok=TOY_EXPERTS_USED,
                       moe_intermediate_size=TOY_EXPERT_FFN, shared_expert_intermediate_size=TOY_EXPERT_FFN,
                       **_QWEN35_LINEAR),
        published=("z-lab/Qwen3-Coder-Next-DFlash",), recurrent=True, convert_args=("--no-mtp",),
    ),
    Family(
        # Gemma 4: five sliding layers then one global layer with a wider head and partial,
        # proportional rotary; embeddings scaled by sqrt(hidden); final-logit soft-capping.
        arch="gemma4", hf_architecture="Gemma4ForCausalLM", config_class="Gemma4TextConfig",
        toy=_attention(num_hidden_layers=6, layer_types=[_SLIDING] * 5 + [_FULL],
                       sliding_window=TOY_WINDOW, tie_word_embeddings=True,
                       hidden_size_per_layer_input=0,
                       final_logit_softcapping=30.0, global_head_dim=32,
                       rope_parameters={
                           "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                           "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                              "rope_theta": 1_000_000.0}}),
        published=("z-lab/gemma-4-26B-A4B-it-DFlash", "z-lab/gemma-4-31B-it-DFlash"),
        sliding=True, target_keys=("attention.sliding_window", "attention.sliding_window_pattern"),
        tokenizer="sentencepiece-bpe",
    ),
    Family(
        # gpt-oss: sliding and full layers alternate; attention sinks and biases; MoE with biases.
        arch="gpt-oss", hf_architecture="GptOssForCausalLM", config_class="GptOssConfig",
        toy=_attention(num_hidden_layers=6, layer_types=[_SLIDING, _FULL] * 3, sliding_window=TOY_WINDOW,
                       intermediate_size=TOY_EXPERT_FFN, num_local_experts=TOY_EXPERTS,
                       num_experts_per_tok=TOY_EXPERTS_USED, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                        "beta_slow": 1.0, "truncate": False,
                                        "original_max_position_embeddings": 4096, "rope_theta": 150_000.0}),
        published=("z-lab/gpt-oss-20b-DFlash", "z-lab/gpt-oss-120b-DFlash"),
        sliding=True, target_keys=("attention.sliding_window",),
    ),
    Family(
        arch="minimax-m2", hf_architecture="MiniMaxM2ForCausalLM", config_class="MiniMaxM2Config",
        toy=_attention(num_hidden_layers=6, intermediate_size=TOY_EXPERT_FFN, num_local_experts=TOY_EXPERTS,
                       num_experts_per_tok=TOY_EXPERTS_USED, tie_word_embeddings=False,
                       rotary_dim=TOY_HEAD_DIM // 2,  # MiniMax-M2: 64 of 128 head dims rotate
                       rope_parameters={"rope_theta": 5_000_000.0, "rope_type": "default",
                                        "partial_rotary_factor": 0.5},
                       # transformers' config class drops it, but the real config.json has it and the
                       # pinned converter reads it: without it the target has no expert gating function
                       # and llama-server aborts on load (llama-graph.cpp, build_moe_ffn)
                       scoring_func="sigmoid", use_routing_bias=True),
        published=("MiniMax M2.5 / M2.7 DFlash",),
    ),
    Family(
        # Muse Glimmer: three sliding layers then a global one (no rope on global layers),
        # output multiplier and final-logit soft-capping.
        arch="muse-glimmer", hf_architecture="MuseGlimmerForConditionalGeneration",
        config_class="MuseGlimmerConfig",
        vision_toy={"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
                    "num_hidden_layers": 2, "layer_types": ["window_attention", "full_attention"],
                    "out_hidden_size": TOY_HIDDEN},
        toy=_attention(num_hidden_layers=8, layer_types=_pattern([_SLIDING] * 3 + [_FULL], 2),
                       layer_rope_theta=_pattern([10_000.0] * 3 + [0], 2), sliding_window=TOY_WINDOW,
                       final_logit_softcapping=20.0, tie_word_embeddings=False),
        published=("meta-models/Muse-Glimmer-30B-DFlash2",), sliding=True,
        target_keys=("attention.sliding_window", "attention.sliding_window_pattern"),
    ),
    Family(
        # LFM2: gated short-convolution layers with attention layers among them.
        arch="lfm2", hf_architecture="Lfm2ForCausalLM", config_class="Lfm2Config",
        toy=_attention(num_hidden_layers=8, full_attn_idxs=[2, 5, 7], conv_L_cache=3,
                       block_auto_adjust_ff_dim=False, tie_word_embeddings=True),
        published=("LFM2.5 DFlash", "LFM2 DSpark"), recurrent=True,
    ),
    Family(
        # Nemotron-H: Mamba-2 layers, MLP layers and a few attention layers.
        arch="nemotron_h", hf_architecture="NemotronHForCausalLM", config_class="NemotronHConfig",
        toy=_attention(num_hidden_layers=8,
                       layers_block_type=[_LINEAR, "mlp", _LINEAR, _FULL, "mlp", _LINEAR, "mlp", _FULL],
                       ssm_state_size=16, mamba_num_heads=4, mamba_head_dim=16, n_groups=2, conv_kernel=4,
                       expand=1, chunk_size=16, tie_word_embeddings=False),
        # transformers >= 5 saves a dense Nemotron-H with MoE defaults, which the pinned converter took
        # for experts (nemotron_h_moe: no layer inputs recorded) until ggml_patches/0011
        published=("Nemotron DFlash",), recurrent=True,
    ),
    Family(
        arch="qwen3moe", hf_architecture="Qwen3MoeForCausalLM", config_class="Qwen3MoeConfig",
        toy=_attention(num_hidden_layers=6, num_experts=TOY_EXPERTS, num_experts_per_tok=TOY_EXPERTS_USED,
                       moe_intermediate_size=TOY_EXPERT_FFN, tie_word_embeddings=False,
                       # as Qwen3-30B-A3B ships it; llama.cpp's qwen3moe graph always renormalises the
                       # chosen experts' weights, so with transformers' default (False) the GGUF computes
                       # another model than the HF folder (drafts 80 % equal to the reference's)
                       norm_topk_prob=True,
                       rope_parameters={"rope_theta": 10_000_000.0, "rope_type": "default"}),
        published=("z-lab/Qwen3-Coder-30B-A3B-DFlash",),
    ),
    Family(
        # DeepSeek-V4: compressed and heavily compressed attention with an indexer, a sliding
        # window, hash-routed then learned-routed experts, partial rotary; published drafters are DSpark
        arch="deepseek4", hf_architecture="DeepseekV4ForCausalLM", config_class="DeepseekV4Config",
        toy=_attention(num_hidden_layers=6, num_key_value_heads=1, head_dim=32, q_lora_rank=32,
                       moe_intermediate_size=TOY_EXPERT_FFN, n_routed_experts=TOY_EXPERTS,
                       num_experts_per_tok=TOY_EXPERTS_USED, n_shared_experts=1, o_groups=2, o_lora_rank=32,
                       # the indexer's keys are rotated by a Hadamard matrix of at least 64 rows in
                       # llama.cpp: a narrower index head aborts the graph (GGML_ASSERT)
                       index_n_heads=2, index_head_dim=64, index_topk=8, qk_rope_head_dim=8,
                       sliding_window=TOY_WINDOW, num_nextn_predict_layers=0, tie_word_embeddings=False),
        # transformers saves its config and tensors in another layout than the original checkpoint
        # the pinned converter reads (KeyError: 'num_hash_layers') until ggml_patches/0011
        published=("DeepSeek-V4 DSpark",), sliding=True,
    ),
    Family(
        arch="llama", hf_architecture="LlamaForCausalLM", config_class="LlamaConfig",
        toy=_attention(num_hidden_layers=6, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "llama3", "rope_theta": 500_000.0, "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 1024}),
        published=("z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat",),
        dflash=DrafterGeometry(block_size=10, num_layers=2),
    ),
)}


# Target architectures whose graph records layer inputs for a drafter (`res->t_layer_inp[il]` in the
# pinned tree's src/models/*.cpp, mapped to their general.architecture names through llama-model.cpp
# and llama-arch.cpp). Another target runs, but a DFlash drafter gets nothing to read.
RECORDING_ARCHS = frozenset({
    "bailingmoe3", "deepseek4", "gemma3n", "gemma4", "gpt-oss", "hunyuan_vl", "lfm2", "llama", "mimo2",
    "minimax-01", "minimax-m2", "muse-glimmer", "nanbeige", "nemotron_h", "qwen3", "qwen35", "qwen35moe",
    "qwen3moe", "qwen3next", "qwen4exp",
})
# Of those, the ones whose graph also records the last layer's output (`res->t_layer_inp[n_layer]`),
# so that a drafter may tap it; the others record the inputs of layers 0..n_layer-1 only, and
# llama-server refuses a drafter that taps the last layer's output of their targets
# (common/speculative.cpp, common_speculative_dflash_mismatch).
# (these three build it only when it is requested, deepseek4 every layer's; llama-server's probe asks them
# since ggml_patches/0012)
RECORDS_LAST_OUTPUT = frozenset({"deepseek4", "mimo2", "nemotron_h"})

# Families with published drafters (or users asking for them) whose targets cannot serve DFlash in
# the pinned tree: their graphs record no layer inputs.
UNSERVED: dict[str, str] = {
    "deepseek2": "Kimi K2.x and DeepSeek-V2/V3 targets: Kimi K2.5-K2.7 DFlash drafters exist, the graph records no layer inputs",
    "glm-dsa": "GLM 5.x targets: GLM-5.1/5.3 DFlash drafters exist, the graph records no layer inputs",
    "glm4moe": "GLM 4.5-4.7 targets: the graph records no layer inputs",
    "gemma3": "Gemma 3 (not 3n) targets: the graph records no layer inputs",
    "nemotron_h_moe": "Nemotron-H MoE targets (and a dense Nemotron-H saved by transformers >= 5, converted "
                      "without ggml_patches/0011): the graph records no layer inputs",
}


def family(arch: str) -> Family:
    try:
        return FAMILIES[arch]
    except KeyError:
        raise KeyError(f"no target family {arch!r}; known: {', '.join(sorted(FAMILIES))}") from None
