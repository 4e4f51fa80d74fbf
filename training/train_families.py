"""Drafters for the target-family zoo, trained on each tiny target's own greedy continuations
(the recipe of training/dflash_recipe.py, scaled to seconds): tests/fixtures/families.py calls
`train_family_drafter` for each family and variant.

The prompts are seeded random token runs: a random-weight target has no language to prompt it in,
and what the drafter must learn is the target's own map from context to next tokens.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from training import dflash_recipe as recipe

PROMPT_TOKENS = 12
NEW_TOKENS = 40
SEQUENCES = 96       # distillation rows; the last HELD_OUT are only evaluated
HELD_OUT = 8
TRAIN = {"dflash": {"steps": 150, "seqs_per_step": 4, "anchors_per_seq": 8, "lr": 3e-3, "gamma": 7.0},
         "dflash2": {"steps": 150, "seqs_per_step": 4, "anchors_per_seq": 8, "lr": 3e-3, "gamma": 4.0}}
SEED = 20261202


def load_target(hf: Path):
    import transformers

    config = transformers.AutoConfig.from_pretrained(hf)
    cls = getattr(transformers, config.architectures[0], None)
    if cls is None or not hasattr(cls, "from_pretrained"):
        cls = transformers.AutoModelForCausalLM
    return cls.from_pretrained(hf, dtype=torch.float32).eval().requires_grad_(False)


def prompts(vocab_rows: int, count: int, seed: int) -> torch.Tensor:
    """Seeded random token runs from the first rows of the vocabulary (ordinary BPE tokens)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(16, min(vocab_rows, 20_000), (count, PROMPT_TOKENS), generator=generator)


@torch.inference_mode()
def greedy_with_features(target, ids: torch.Tensor, new_tokens: int, layer_ids: list[int]):
    """Greedy continuations (no cache: the toys are tiny, and every family's forward pass runs the
    same way) and the tapped hidden states of every token but the last."""
    from dflash.model import extract_context_feature

    for _ in range(new_tokens):
        out = target(ids, logits_to_keep=1)
        ids = torch.cat([ids, out.logits[:, -1].argmax(-1, keepdim=True)], 1)
    out = target(ids[:, :-1], output_hidden_states=True)
    return ids, extract_context_feature(out.hidden_states, layer_ids).half()


def distill(target, layer_ids: list[int], mask_token_id: int, vocab_rows: int) -> tuple[recipe.DistillSet, ...]:
    ids, feats = greedy_with_features(target, prompts(vocab_rows, SEQUENCES, SEED), NEW_TOKENS, layer_ids)
    sets = []
    for rows in (slice(0, SEQUENCES - HELD_OUT), slice(SEQUENCES - HELD_OUT, SEQUENCES)):
        n = len(ids[rows])
        sets.append(recipe.DistillSet(
            ids=ids[rows], feats=feats[rows], valid_end=torch.full((n,), feats.shape[1]),
            first_anchor=torch.full((n,), PROMPT_TOKENS - 1), mask_token_id=mask_token_id))
    return tuple(sets)


def acceptance_rate(drafter, target, held_out: recipe.DistillSet, spec: dict) -> float:
    """Accepted drafts / drafted positions on the held-out rows, `dflash_generate`'s rule replayed
    on the target's greedy path."""
    accepted = drafted = 0
    for row in range(len(held_out.ids)):
        lengths = recipe.replay_acceptance(
            drafter, target, held_out.ids[row].tolist(), held_out.feats[row].float(), PROMPT_TOKENS,
            NEW_TOKENS, spec, held_out.mask_token_id, stop_ids=[])
        accepted += sum(n - 1 for n in lengths)
        drafted += len(lengths) * (spec["block_size"] - 1)
    return accepted / max(1, drafted)


def train_family_drafter(hf_target: Path, config: dict, variant: str, out: Path) -> dict:
    """Train the drafter `config` describes on the target's greedy continuations, save it to `out`
    (config.json + model.safetensors); its held-out acceptance rate and training time."""
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    started = time.time()
    target = load_target(hf_target)
    layer_ids = config["dflash_config"]["target_layer_ids"]
    train, held_out = distill(target, layer_ids, config["dflash_config"]["mask_token_id"],
                              config["vocab_size"])
    spec = {**TRAIN[variant], "architecture": config["architectures"][0],
            "block_size": config["dflash_config"]["block_size"]}
    drafter = recipe.new_drafter(config, SEED)
    before = acceptance_rate(drafter.eval(), target, held_out, spec)
    drafter = recipe.train_drafter(drafter, target, train, spec, spec["steps"], SEED, variant)
    after = acceptance_rate(drafter, target, held_out, spec)
    recipe.save_drafter(drafter, out, config)
    return {"acceptance_untrained": round(before, 4), "acceptance": round(after, 4),
            "seconds": round(time.time() - started, 1)}
