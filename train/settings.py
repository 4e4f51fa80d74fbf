"""What a `dflash-gguf train` run is: the drafter's shape (defaults as published drafters of the
target's size have it) and the recipe's settings per variant."""

from __future__ import annotations

from dataclasses import dataclass

from dflash_gguf.gguf.checkpoint import build_target_layer_ids
from dflash_gguf.variants import VARIANTS as TABLE
from dflash_gguf.variants import Variant, architecture
from .frozen import TargetShape

# The recipe per variant (train/recipe.py; measured on SmolLM2 in training/README.md): blocks per
# step, learning rate, position-weight decay, soft labels against the target's top-k, the sampled
# softmax's drawn rows; the class and block size are the variant table's (dflash_gguf/variants.py).
# DFlash 2's convolution and selector sizes are llama.cpp's constraints
# (n_embd % conv_group_size == 0, n_embd >= top_k * (top_k + 1)) with z-lab's published values.
RECIPES = {
    Variant.DFLASH: {"seqs_per_step": 8, "anchors_per_seq": 8, "lr": 1.5e-3, "gamma": 7.0, "soft_labels": 0.5,
                     "sampled_softmax": 1024},
    Variant.DFLASH2: {"seqs_per_step": 4, "anchors_per_seq": 8, "lr": 1.5e-3, "gamma": 4.0, "soft_labels": 0.5,
                      "sampled_softmax": 1024,
                      "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 16, "selector_top_k": 8},
}
VARIANTS = {name: {"architecture": architecture(name), "block_size": TABLE[name].block_size, **recipe}
            for name, recipe in RECIPES.items()}
# config.json architectures -> the variant's name as --variant spells it (a plain str: the run key
# hashes the plan's str())
ARCHITECTURES = {spec["architecture"]: name.value for name, spec in VARIANTS.items()}

TEACHER_TOP_K = 32  # the target's most likely next tokens kept per position (soft labels, sampled softmax)


def default_layers(target: TargetShape) -> int:
    """z-lab's drafters of billion-parameter targets have 5 layers (Qwen3-4B/8B-DFlash-b16); for a
    target as small as SmolLM2-135M the project's drafters have 2 (training/README.md)."""
    return 5 if target.n_embd >= 2048 else 2


def default_taps(target: TargetShape, layers: int) -> list[int]:
    """One tap per drafter layer as z-lab's (build_target_layer_ids(n_layer, layers)), at least 3."""
    return build_target_layer_ids(target.n_layer, max(3, layers))


@dataclass(frozen=True)
class DrafterPlan:
    variant: str
    layers: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int

    def spec(self) -> dict:
        return {**VARIANTS[self.variant], "num_layers": self.layers, "block_size": self.block_size}

    @property
    def llama_taps(self) -> list[int]:
        """llama.cpp's layer ids: the input of layer id + 1 (HF hidden_states[id + 1])."""
        return [i + 1 for i in self.target_layer_ids]


TOKEN_UNUSED, TOKEN_CONTROL = 5, 3  # llama.cpp's token types (tokenizer.ggml.token_type)


def mask_token(tokens: list[str], types: list[int], special: set[int], chat_template: str | None) -> int | None:
    """A token the drafter's blocks can be padded with that the target never writes: the last
    unused row (a padded vocabulary, as z-lab's Qwen3 drafters use 151669), else the last control
    token that is not one of the tokenizer's special ids and that the chat template does not name
    (SmolLM2: 16, `<empty_output>`, a token of its pretraining format)."""
    for wanted in (TOKEN_UNUSED, TOKEN_CONTROL):
        for i in range(len(tokens) - 1, -1, -1):
            if types[i] == wanted and i not in special and (chat_template is None or tokens[i] not in chat_template):
                return i
    return None
