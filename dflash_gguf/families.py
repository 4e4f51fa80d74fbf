"""What the product knows of the target families published DFlash drafters serve, by `general.architecture`:
the GGUF keys a target of a family must carry for a drafter to run as published (doctor names a target
without them), which architectures' graphs record the layer inputs a drafter reads (and the last
layer's output), and the families that cannot serve DFlash with the reason (the converter's target
checks). The zoo's tiny targets of these families are built on the dev side (training/fixtures/toys.py).
"""

from __future__ import annotations

# GGUF keys (without the `<arch>.` prefix) a target of the family carries that a drafter's run depends
# on: without them llama.cpp runs the target with its defaults, not the model's own window or rope
# sections.
TARGET_KEYS: dict[str, tuple[str, ...]] = {
    "qwen35": ("rope.dimension_sections",),
    "qwen35moe": ("rope.dimension_sections",),
    "gemma4": ("attention.sliding_window", "attention.sliding_window_pattern"),
    "gpt-oss": ("attention.sliding_window",),
    "muse-glimmer": ("attention.sliding_window", "attention.sliding_window_pattern"),
}


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
