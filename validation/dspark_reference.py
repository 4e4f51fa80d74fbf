"""A DSpark drafter in PyTorch: the math the pinned llama.cpp runs for `--spec-type draft-dspark`
(DFlash-lineage, full vocabulary, anchor-first), since the z-lab reference (`dflash==0.1.0`) has no
DSpark model. Extra `dflash-gguf[reference]`.

DSpark = the DFlash layers (z-lab's `DFlashDraftModel`, reused as it is) + a Markov head + an
optional confidence head. llama.cpp drafts one block `[id_last, mask x (n-1)]` at positions
pos..pos+n-1 over the target features of positions < pos, exactly as DFlash, and then, anchor
first (`dflash.sample_from_anchor` true), reads *every* block position: position i proposes the
token after it,

    logits_i = lm_head(norm(h_i)) + markov_w2 @ markov_w1[prev_i]
    prev_0 = id_last,  prev_{i+1} = argmax(logits_i)          (draft token i = argmax(logits_i))
    confidence_i = sigmoid(conf_proj . [norm(h_i); markov_w1[prev_i]] + conf_bias)

so a block of n positions drafts n tokens. The chain is greedy (argmax) in llama.cpp's graph, and
the target's logit scale / softcap are not applied to the base logits before the bias is added.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from dflash.model import (DFlashDraftModel, _crop_to, _draft_value, _make_cache, _output_head,
                          _raw_input_embeddings, extract_context_feature)
from torch import nn


class MarkovHead(nn.Module):
    """`markov_head.markov_w1` (an embedding of the previous token, rank R) and `markov_w2` (R ->
    vocabulary): the bias the previous token adds to a position's logits."""

    def __init__(self, vocab_size: int, rank: int) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)

    def forward(self, previous: torch.Tensor) -> torch.Tensor:
        return self.markov_w2(self.markov_w1(previous))


class ConfidenceHead(nn.Module):
    """`confidence_head.proj`: the probability that a position's draft is accepted, from its hidden
    state and the previous token's Markov embedding (llama.cpp truncates a draft below
    `--spec-draft-p-min` with it)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, 1, bias=True)

    def forward(self, hidden: torch.Tensor, previous_embedding: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([hidden, previous_embedding], -1))[..., 0]  # logit


class DSparkDraftModel(DFlashDraftModel):
    """config.json as DSpark's DFlash-lineage checkpoints write it: the DFlash fields plus
    `markov_rank`, `has_confidence_head` (and `sample_from_anchor`, default true)."""

    def __init__(self, config) -> None:
        super().__init__(config)
        if not bool(_draft_value(config, "sample_from_anchor", True)):
            raise ValueError("only anchor-first DSpark (sample_from_anchor true) is modelled here")
        if _draft_value(config, "markov_head_type", "vanilla") != "vanilla":
            raise ValueError("only the vanilla Markov head is modelled here")
        rank = int(_draft_value(config, "markov_rank"))
        self.markov_head = MarkovHead(config.vocab_size, rank)
        self.confidence_head = (ConfidenceHead(config.hidden_size + rank)
                                if bool(_draft_value(config, "has_confidence_head", False)) else None)
        self.post_init()

    def position_logits(self, hidden: torch.Tensor, previous: torch.Tensor, output_head: nn.Module) -> torch.Tensor:
        """Logits of block positions [.., n, V] given the token before each [.., n] (teacher-forced
        in training; the drafted chain at run time)."""
        return output_head(hidden) + self.markov_head(previous)

    def confidence_logit(self, hidden: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        return self.confidence_head(hidden, self.markov_head.markov_w1(previous))

    def draft(self, hidden: torch.Tensor, anchor_ids: torch.Tensor, output_head: nn.Module):
        """The greedy chain of llama.cpp's graph over a block's hidden states [B, n, H]: the draft
        tokens [B, n] and their confidences [B, n] (None without a confidence head)."""
        base = output_head(hidden)
        previous = anchor_ids
        tokens, confidences = [], []
        for i in range(base.shape[1]):
            if self.confidence_head is not None:
                confidences.append(torch.sigmoid(self.confidence_logit(hidden[:, i], previous)))
            previous = torch.argmax(base[:, i] + self.markov_head(previous), dim=-1)
            tokens.append(previous)
        return torch.stack(tokens, 1), (torch.stack(confidences, 1) if confidences else None)


@torch.inference_mode()
def dspark_generate(model: DSparkDraftModel, target: nn.Module, input_ids: torch.LongTensor, max_new_tokens: int,
                    stop_token_ids: list[int] | None, n_draft: int | None = None) -> SimpleNamespace:
    """Greedy speculative decoding with a DSpark drafter, laid out as `dflash.model.dflash_generate`
    (same caches, same stop rule, same statistics) but anchor-first: each step drafts up to
    `n_draft` (default block_size) tokens and the target verifies `[anchor, drafts]`."""
    n_draft = model.block_size if n_draft is None else n_draft
    n_input = input_ids.shape[1]
    max_length = n_input + max_new_tokens
    output_ids = torch.full((1, max_length + 1), int(model.mask_token_id), dtype=torch.long)
    position_ids = torch.arange(output_ids.shape[1])[None]
    target_cache, draft_cache = _make_cache(target.config), _make_cache(model.config)
    head = _output_head(target)

    out = target(input_ids, position_ids=position_ids[:, :n_input], past_key_values=target_cache, use_cache=True,
                 logits_to_keep=1, output_hidden_states=True)
    output_ids[:, :n_input] = input_ids
    output_ids[:, n_input] = out.logits[:, -1].argmax(-1)
    target_hidden = extract_context_feature(out.hidden_states, model.target_layer_ids)
    _crop_to(target_cache, n_input)

    stops = torch.tensor(stop_token_ids or [], dtype=torch.long)
    acceptance_lengths = []
    start = n_input
    stopped = bool(torch.isin(output_ids[:, start], stops).any())
    while start + 1 < max_length and not stopped:
        n = min(n_draft, max_length - start - 1)
        block = output_ids[:, start:start + n + 1].clone()
        noise = _raw_input_embeddings(target, block[:, :n], float(_draft_value(model.config, "input_embedding_scale", 1.0)))
        hidden = model(target_hidden=target_hidden, noise_embedding=noise,
                       position_ids=position_ids[:, start - target_hidden.shape[1]:start + n],
                       past_key_values=draft_cache, use_cache=True)
        _crop_to(draft_cache, start)
        block[:, 1:], _ = model.draft(hidden, block[:, 0], head)

        out = target(block, position_ids=position_ids[:, start:start + n + 1], past_key_values=target_cache,
                     use_cache=True, output_hidden_states=True)
        posterior = out.logits.argmax(-1)
        accepted = int((block[:, 1:] == posterior[:, :-1]).cumprod(dim=1).sum(dim=1)[0])
        output_ids[:, start:start + accepted + 1] = block[:, :accepted + 1]
        output_ids[:, start + accepted + 1] = posterior[:, accepted]
        produced = min(accepted + 1, max_length - start - 1)
        hits = torch.isin(output_ids[0, start + 1:start + produced + 1], stops).nonzero(as_tuple=True)[0]
        if hits.numel() > 0:
            produced, stopped = int(hits[0]) + 1, True
        start += produced
        _crop_to(target_cache, start)
        acceptance_lengths.append(produced)
        target_hidden = extract_context_feature(out.hidden_states, model.target_layer_ids)[:, :produced]

    output_ids = output_ids[:, :min(start + 1, max_length)]
    return SimpleNamespace(output_ids=output_ids, num_input_tokens=n_input, acceptance_lengths=acceptance_lengths)
