"""The z-lab reference drafter's (PyPI dflash==0.1.0, `dflash.model`) greedy draft for one block,
laid out as llama.cpp's DFlash speculator drafts it, to compare with the `dflash draft:` lines that
ggml_patches/0003 logs.

llama.cpp drafts with the target's features of the tokens already in its context (positions
0..pos-1, tapped at the layers of the drafter's `target_layer_ids`) injected into the draft KV cache,
and one block `[id_last, mask x n_draft]` at positions pos..pos+n_draft; the draft is the argmax of
the block's positions 1..n_draft. The same as one step of `dflash.model.dflash_generate`:
`llama-speculative-simple` starts with context = prompt[:-1], id_last = prompt[-1];
`llama-server` with context = the whole prompt, id_last = the target's first sampled token.

DSpark drafters (`dflash_gguf.validation.dspark_reference`, anchor-first) draft from a block
`[id_last, mask x (n_draft-1)]`, every position through the Markov chain; with `p_min` the draft
stops before the first position whose confidence is below it, as llama.cpp's `--spec-draft-p-min`.

Everything runs in float32 from the checkpoints' bf16 weights.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch


@functools.lru_cache(maxsize=4)
def _target(target_dir: str):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()


@functools.lru_cache(maxsize=8)
def _drafter(drafter_dir: str):
    from dflash_gguf.validation.reference import drafter_class
    return drafter_class(Path(drafter_dir)).from_pretrained(drafter_dir, dtype=torch.float32).eval()


@functools.lru_cache(maxsize=4)
def _tokenizer(target_dir: str):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(target_dir)


def tokenize(target_dir: Path, text: str) -> list[int]:
    """The target's token ids for `text` (no special tokens added: Qwen adds no BOS)."""
    return list(_tokenizer(str(target_dir))(text).input_ids)


def reference_layer_causality(drafter_dir: Path) -> list[bool]:
    """Per draft layer, whether the reference attends causally (Qwen3DFlashAttention.is_causal)."""
    return [bool(layer.self_attn.is_causal) for layer in _drafter(str(drafter_dir)).layers]


def reference_draft(drafter_dir: Path, target_dir: Path, context_ids: list[int], id_last: int,
                    n_draft: int, causal: list[bool] | None = None,
                    mask_embedding: torch.Tensor | None = None, p_min: float = 0.0) -> list[int]:
    """The reference's greedy draft of `n_draft` tokens after `context_ids` + `id_last`.

    `mask_embedding` stands in for the target's embedding row of the mask token (a drafter's own
    mask_embedding.pt, which the reference does not read itself).

    `causal` overrides the per-layer causality the reference decides (e.g. `[False] * n_layers`:
    every layer non-causal, what upstream llama.cpp does without `dflash.attention.causal`); the
    model is restored afterwards.
    """
    from dflash.model import _output_head

    from dflash_gguf.validation.draft_parity import block_hidden, block_logits

    target = _target(str(target_dir))
    draft = _drafter(str(drafter_dir))
    layers = [layer.self_attn for layer in draft.layers]
    saved = [attn.is_causal for attn in layers]
    if causal is not None and len(causal) != len(layers):
        raise ValueError(f"causal has {len(causal)} entries for a drafter of {len(layers)} layers")

    try:
        for attn, value in zip(layers, causal if causal is not None else saved):
            attn.is_causal = value
        if not hasattr(draft, "markov_head"):
            return block_logits(draft, target, context_ids, id_last, n_draft, mask_embedding).argmax(-1).tolist()
        block = torch.full((1, n_draft), int(draft.mask_token_id), dtype=torch.long)
        block[0, 0] = id_last
        h = block_hidden(draft, target, context_ids, block, mask_embedding)
        with torch.inference_mode():
            tokens, confidence = draft.draft(h, block[:, 0], _output_head(target))
        kept = n_draft if p_min <= 0 else int((confidence[0] >= p_min).cumprod(0).sum())
        return tokens[0, :kept].tolist()
    finally:
        for attn, value in zip(layers, saved):
            attn.is_causal = value
