"""Are llama.cpp's drafts the reference's? Step by step, at the same context.

Every draft the speculative run made is in the server's log (patch 0003's `dflash draft:` line: the
position of the block's first token, `id_last`, the drafted ids), and the context it drafted from is
the prompt and the tokens emitted before that position. The z-lab PyTorch reference drafts the same
block from the same context (the HF target's features of the context at the drafter's
`target_layer_ids`, then one block `[id_last, mask...]`), in float32, and decodes it as the drafter
does (`greedy_block`: argmax for DFlash, the candidate selector for DFlash 2, the Markov head for
DSpark). Per step: is the first drafted token the reference's, and the whole block?

A step that differs is not by itself a bug: where the reference's top two tokens are nearly tied,
any change of arithmetic can pick the other one. How near counts as a tie is measured on the same
run: the reference drafts every step again as llama.cpp's CPU computes with F16 weights (the weights
rounded to float16, every matmul's input rounded to float16, the rest in float32: wholly float16
activations overflow in real models, SmolLM2's logits become NaN), and the largest score difference
between the two (`noise`) is the yardstick. A differing step whose reference margin (the reference's
score minus that of llama.cpp's token) is within it is a near-tie; one beyond it is systematic.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Sequence

from .reference import drafter_class, load_target
from .server_steps import Step

if TYPE_CHECKING:
    import torch


def context_features(draft, target, ids: Sequence[int]):
    """The target's features (1, len(ids), k * hidden) at the drafter's `target_layer_ids`. The target
    is causal, so the first p rows are the features of `ids[:p]`: one forward serves every step of a
    prompt."""
    # extra: [reference] (PyTorch, transformers, the z-lab model)
    import torch
    from dflash.model import extract_context_feature

    with torch.inference_mode():
        out = target(torch.tensor([list(ids)], dtype=torch.long), output_hidden_states=True)
        return extract_context_feature(out.hidden_states, draft.target_layer_ids)


def block_hidden(draft, target, context_ids: Sequence[int], block, mask_embedding=None, features=None):
    """The reference drafter's output states for `block` (1, n) after `context_ids`, as llama.cpp's
    DFlash speculator lays them out: the context's target features (at the drafter's
    `target_layer_ids`; the first len(context_ids) rows of `features` where given) injected, the block
    at the positions after the context. `mask_embedding` stands in for the target's embedding row of
    the mask token (a drafter's own mask_embedding.pt)."""
    # extra: [reference] (PyTorch, transformers, the z-lab model)
    import torch
    from dflash.model import _draft_value, _raw_input_embeddings

    n = len(context_ids)
    hidden = (context_features(draft, target, context_ids) if features is None else features)[:, :n]
    with torch.inference_mode():
        scale = float(_draft_value(draft.config, "input_embedding_scale", 1.0))
        noise = _raw_input_embeddings(target, block, scale)
        if mask_embedding is not None:
            noise[block == int(draft.mask_token_id)] = mask_embedding.to(noise.dtype) * scale
        positions = torch.arange(n + block.shape[1])[None]
        return draft(target_hidden=hidden, noise_embedding=noise, position_ids=positions)


def block_logits(draft, target, context_ids: Sequence[int], id_last: int, n_draft: int, mask_embedding=None,
                 features=None):
    """The reference DFlash drafter's logits (n_draft, vocab) for the block `[id_last, mask x n_draft]`
    after `context_ids`: row i decides the i-th drafted token."""
    # extra: [reference] (PyTorch, transformers, the z-lab model)
    import torch
    from dflash.model import _output_head

    block = torch.full((1, n_draft + 1), int(draft.mask_token_id), dtype=torch.long)
    block[0, 0] = int(id_last)
    h = block_hidden(draft, target, context_ids, block, mask_embedding, features)
    with torch.inference_mode():
        return draft.compute_logits(h[:, 1:, :], _output_head(target))[0].float()


def _anchor_first(draft) -> bool:
    """DSpark drafts from the anchor's own position (block `[id_last, mask x (n - 1)]`); DFlash and
    DFlash 2 from the n positions after it."""
    return hasattr(draft, "markov_head")


def drafted_states(draft, target, context_ids: Sequence[int], id_last: int, n_draft: int, features=None):
    """The drafter's output states (n_draft, hidden) that decide the n_draft drafted tokens."""
    # extra: [reference] (PyTorch, transformers, the z-lab model)
    import torch

    width = n_draft if _anchor_first(draft) else n_draft + 1
    block = torch.full((1, width), int(draft.mask_token_id), dtype=torch.long)
    block[0, 0] = int(id_last)
    return block_hidden(draft, target, context_ids, block, features=features)[0, width - n_draft:]


class Scores(NamedTuple):
    """Per drafted position (n, vocab): what the drafter's greedy decoding takes the argmax of
    (`picked`: -inf where it cannot pick), the same before that restriction (`full`), and how far each
    token is from being pickable (`outside`: DFlash 2's logit distance below its k-th candidate)."""
    picked: "torch.Tensor"
    full: "torch.Tensor"
    outside: "torch.Tensor"

    def margin(self, row: int, token: int) -> float:
        """How far the drafter is from taking `token` at `row`: its score below the choice's, or its
        distance from the candidates, whichever is larger."""
        gap = float(self.picked[row].max() - self.full[row, token])
        return round(max(gap, float(self.outside[row, token])), 6)


def draft_scores(draft, target, states, predecessors) -> Scores:
    """The scores of each drafted position given its predecessor (the token before it in the block).
    DFlash: its logits. DSpark: its head's logits plus the Markov head's row. DFlash 2: its logits
    plus the candidate selector's predecessor-successor term, over its top-k candidates by logit."""
    # extra: [reference] (PyTorch, transformers, the z-lab model)
    import torch
    from dflash.model import _output_head

    with torch.inference_mode():
        if _anchor_first(draft):
            scores = (_output_head(target)(states) + draft.markov_head(predecessors)).float()
            return Scores(scores, scores, torch.zeros_like(scores))
        logits = draft.compute_logits(states, _output_head(target)).float()
        selector = getattr(draft, "candidate_selector", None)
        if selector is None:
            return Scores(logits, logits, torch.zeros_like(logits))
        pair = selector.predecessor_codebook(predecessors) * selector.hidden_projection(states)
        scores = (logits + pair @ selector.successor_codebook.weight.T).float()
        top = logits.topk(selector.top_k, -1)
        keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, top.indices, True)
        return Scores(scores.masked_fill(~keep, float("-inf")), scores, (top.values[:, -1:] - logits).clamp(min=0))


def greedy_block(draft, target, states, id_last: int) -> tuple[list[int], Scores]:
    """The reference's drafted tokens and the scores of its own path, row by row."""
    # extra: [reference] (PyTorch, transformers, the z-lab model)
    import torch

    tokens, rows, previous = [], [], int(id_last)
    for k in range(states.shape[0]):
        row = draft_scores(draft, target, states[k:k + 1], torch.tensor([previous]))
        previous = int(row.picked[0].argmax())
        tokens.append(previous)
        rows.append(row)
    return tokens, Scores(*(torch.cat(parts) for parts in zip(*rows)))


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


def _round_matmul_inputs(model) -> None:
    """Round every linear layer's input to float16, as llama.cpp's CPU matmul with F16 weights does
    (ggml converts the activations to the weights' dot type); the rest stays in float32."""
    # extra: [reference] (PyTorch, transformers, the z-lab model)
    import torch

    def to_f16(_module, args):
        return (args[0].to(torch.float16).float(), *args[1:])

    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_pre_hook(to_f16)


def _finite_difference(a, b) -> float:
    # extra: [reference] (PyTorch, transformers, the z-lab model)
    import torch

    both = torch.isfinite(a) & torch.isfinite(b)
    return float((a - b).abs()[both].max()) if both.any() else 0.0


def draft_parity(draft_dir: Path, target_dir: Path, prompt_ids: Sequence[Sequence[int]],
                 emitted: Sequence[Sequence[int]], steps: Sequence[Sequence[Step]]) -> dict:
    """The parity report: shares of steps whose first token / whole block equal the reference's,
    the F16-vs-F32 noise, and the first step that differs with both drafts and their margins."""
    # extra: [reference] (PyTorch, transformers, the z-lab model)
    import torch

    cls = drafter_class(Path(draft_dir))
    models = {dtype: (cls.from_pretrained(str(draft_dir), dtype=dtype).eval().float(),
                      load_target(Path(target_dir), dtype).float())
              for dtype in (torch.float32, torch.float16)}
    for model in models[torch.float16]:
        _round_matmul_inputs(model)
    (draft, target), (draft16, target16) = models[torch.float32], models[torch.float16]
    sequences = [list(p) + list(t) for p, t in zip(prompt_ids, emitted)]
    features: dict = {}
    compared = []
    noise = 0.0
    for step, context, id_last in draft_steps(prompt_ids, emitted, steps):
        if step.prompt not in features:
            features = {step.prompt: (context_features(draft, target, sequences[step.prompt]),
                                      context_features(draft16, target16, sequences[step.prompt]))}
        f32, f16 = features[step.prompt]
        n = len(step.llama)
        states = drafted_states(draft, target, context, id_last, n, f32)
        reference, scores = greedy_block(draft, target, states, id_last)
        states16 = drafted_states(draft16, target16, context, id_last, n, f16)
        along_reference = torch.tensor([id_last] + reference[:-1])
        noise = max(noise, _finite_difference(scores.picked,
                                              draft_scores(draft16, target16, states16, along_reference).picked))
        along_llama = draft_scores(draft, target, states, torch.tensor([id_last] + step.llama[:-1]))
        compared.append((step, reference, scores, along_llama))
    first_equal = block_equal = 0
    differing = []
    for step, reference, scores, along_llama in compared:
        first_equal += reference[0] == step.llama[0]
        block_equal += reference == step.llama
        if reference != step.llama:
            # up to i both blocks are one path, so row i of the reference's scores is llama.cpp's too
            i = next(k for k, (a, b) in enumerate(zip(reference, step.llama)) if a != b)
            differing.append({"prompt": step.prompt, "position": step.position, "first_difference": i,
                              "llama": step.llama, "reference": reference,
                              "reference_margin": scores.margin(i, step.llama[i]),
                              "llama_margins": [along_llama.margin(k, t) for k, t in enumerate(step.llama)],
                              "reference_top2_gaps": [round(float(v[0] - v[1]), 6)
                                                      for v in scores.picked.topk(2, dim=-1).values]})
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
