"""Are llama.cpp's drafts the reference's? Step by step, at the same context.

Every draft the speculative run made is in the server's log (patch 0003's `dflash draft:` line: the
position of the block's first token, `id_last`, the drafted ids), and the context it drafted from is
the prompt and the tokens emitted before that position. The z-lab PyTorch reference drafts the same
block from the same context (`block_logits`: the HF target's features of the context at the
drafter's `target_layer_ids`, then one block `[id_last, mask...]`), in float32. Per step: is the
first drafted token the reference's, and the whole block?

A step that differs is not by itself a bug: where the reference's top two tokens are nearly tied,
any change of arithmetic can pick the other one. How near counts as a tie is measured on the same
run: the reference drafts every step again in float16, and the largest logit difference between
the two (`noise`) is the yardstick. A differing step whose reference margin (top logit minus the
logit of llama.cpp's token) is within it is a near-tie; one beyond it is systematic.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .server_steps import Step


def block_hidden(draft, target, context_ids: Sequence[int], block, mask_embedding=None):
    """The reference drafter's output states for `block` (1, n) after `context_ids`, as llama.cpp's
    DFlash speculator lays them out: the context's target features (at the drafter's
    `target_layer_ids`) injected, the block at the positions after the context. `mask_embedding`
    stands in for the target's embedding row of the mask token (a drafter's own mask_embedding.pt)."""
    import torch
    from dflash.model import _draft_value, _raw_input_embeddings, extract_context_feature

    context = torch.tensor([list(context_ids)], dtype=torch.long)
    with torch.inference_mode():
        out = target(context, output_hidden_states=True)
        hidden = extract_context_feature(out.hidden_states, draft.target_layer_ids)
        scale = float(_draft_value(draft.config, "input_embedding_scale", 1.0))
        noise = _raw_input_embeddings(target, block, scale)
        if mask_embedding is not None:
            noise[block == int(draft.mask_token_id)] = mask_embedding.to(noise.dtype) * scale
        positions = torch.arange(context.shape[1] + block.shape[1])[None]
        return draft(target_hidden=hidden, noise_embedding=noise, position_ids=positions)


def block_logits(draft, target, context_ids: Sequence[int], id_last: int, n_draft: int, mask_embedding=None):
    """The reference DFlash drafter's logits (n_draft, vocab) for the block `[id_last, mask x n_draft]`
    after `context_ids`: row i decides the i-th drafted token."""
    import torch
    from dflash.model import _output_head

    block = torch.full((1, n_draft + 1), int(draft.mask_token_id), dtype=torch.long)
    block[0, 0] = int(id_last)
    h = block_hidden(draft, target, context_ids, block, mask_embedding)
    with torch.inference_mode():
        return draft.compute_logits(h[:, 1:, :], _output_head(target))[0].float()


@dataclass
class DraftStep:
    prompt: int      # index of the prompt
    position: int    # of id_last, the block's first token
    llama: list[int]  # llama.cpp's whole draft block, as logged before the server trimmed it


def draft_steps(prompt_ids: Sequence[Sequence[int]], emitted: Sequence[Sequence[int]],
                steps: Sequence[Sequence[Step]]) -> list[tuple[DraftStep, list[int], int]]:
    """Every logged draft with its context and id_last, where the run's tokens reach it."""
    result = []
    for n, (prompt, tokens, task_steps) in enumerate(zip(prompt_ids, emitted, steps)):
        sequence = list(prompt) + list(tokens)
        for step in task_steps:
            if step.proposed and step.position < len(sequence):
                result.append((DraftStep(n, step.position, list(step.proposed)), sequence[:step.position],
                               sequence[step.position]))
    return result


def _margin(logits, token: int) -> float:
    return float(logits.max() - logits[token])


def draft_parity(draft_dir: Path, target_dir: Path, prompt_ids: Sequence[Sequence[int]],
                 emitted: Sequence[Sequence[int]], steps: Sequence[Sequence[Step]]) -> dict:
    """The parity report: shares of steps whose first token / whole block equal the reference's,
    the F16-vs-F32 noise, and the first step that differs with both drafts and their margins."""
    import torch
    from transformers import AutoModelForCausalLM

    from .reference import drafter_class

    cls = drafter_class(Path(draft_dir))
    models = {dtype: (cls.from_pretrained(str(draft_dir), dtype=dtype).eval(),
                      AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=dtype).eval())
              for dtype in (torch.float32, torch.float16)}
    todo = draft_steps(prompt_ids, emitted, steps)
    compared = []
    noise = 0.0
    for step, context, id_last in todo:
        f32 = block_logits(*models[torch.float32], context, id_last, len(step.llama))
        f16 = block_logits(*models[torch.float16], context, id_last, len(step.llama))
        noise = max(noise, float((f32 - f16).abs().max()))
        compared.append((step, f32))
    first_equal = block_equal = 0
    differing = []
    for step, logits in compared:
        reference = logits.argmax(-1).tolist()
        first_equal += reference[0] == step.llama[0]
        block_equal += reference == step.llama
        if reference != step.llama:
            i = next(k for k, (a, b) in enumerate(zip(reference, step.llama)) if a != b)
            differing.append({"prompt": step.prompt, "position": step.position, "first_difference": i,
                              "llama": step.llama, "reference": reference,
                              "reference_margin": round(_margin(logits[i], step.llama[i]), 6),
                              "llama_margins": [round(_margin(logits[k], t), 6) for k, t in enumerate(step.llama)],
                              "reference_top2_gaps": [round(float(v[0] - v[1]), 6)
                                                      for v in logits.topk(2, dim=-1).values]})
    for d in differing:
        d["verdict"] = "near-tie" if d["reference_margin"] <= noise else "systematic"
    n = len(compared)
    return {
        "steps": n,
        "first_position_equal": round(first_equal / n, 4) if n else None,
        "block_equal": round(block_equal / n, 4) if n else None,
        "differing_steps": len(differing),
        "systematic": sum(d["verdict"] == "systematic" for d in differing),
        "noise_f16_vs_f32": round(noise, 6),
        "first_differing_step": differing[0] if differing else None,
    }
