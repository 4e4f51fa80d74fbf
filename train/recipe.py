"""The DFlash training recipe, shared by every drafter this project trains (training/train_pair.py's
tiny pair, training/train_smollm2.py's SmolLM2 drafters): the drafter's config.json, its
initialisation, the block-diffusion loss on the target's own greedy continuations, the training
loop (checkpointed, resumable) and the bf16 safetensors it is saved as. The recipe itself is
described in training/README.md.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from dflash_gguf.validation.reference import reference_class
from dflash_gguf.variants import ARCHITECTURES, VARIANTS, Variant

DFLASH2_KEYS = VARIANTS[Variant.DFLASH2].config_fields


@dataclass
class DistillSet:
    """The self-distillation set: token rows (prompt + the target's greedy continuation, padded),
    the target's tapped hidden states of every token, where each row's labels end (exclusive) and
    its first anchor (the last prompt token)."""

    ids: torch.Tensor           # [N, L] long
    feats: torch.Tensor         # [N, >= L - 1, n_taps * hidden] (half precision)
    valid_end: torch.Tensor     # [N]
    first_anchor: torch.Tensor  # [N]
    mask_token_id: int
    # the target's final (normed) hidden state of every fed token, [N, >= L - 1, hidden] (half);
    # through its head, the target's distribution over the next token (the soft labels)
    finals: torch.Tensor | None = None
    # the target's top-k next tokens at every fed position and their log-probabilities (of the whole
    # vocabulary), [N, >= L - 1, k] int32 / half: what `sampled_softmax` reads (teacher_top_k())
    teacher_ids: torch.Tensor | None = None
    teacher_logp: torch.Tensor | None = None


@dataclass(frozen=True)
class DrafterShape:
    """The sizes a drafter shares with its target (it borrows the target's embeddings and head)."""

    hidden: int
    n_head: int
    n_head_kv: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float
    rms_eps: float
    max_positions: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    eos_token_id: int | None


def log(*parts) -> None:
    print(time.strftime("%H:%M:%S"), *parts, file=sys.stderr, flush=True)


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                    encoding="utf-8")


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def variant_of(spec: dict) -> Variant:
    """The variant a recipe's spec (its "architecture", a config.json class name) makes."""
    return ARCHITECTURES[spec["architecture"]]


def drafter_config_dict(spec: dict, shape: DrafterShape) -> dict:
    """config.json as z-lab's 2026 drafters write it (settings nested in dflash_config)."""
    dflash = {"block_size": spec["block_size"], "mask_token_id": shape.mask_token_id,
              "target_layer_ids": list(shape.target_layer_ids)}
    dflash.update({key: spec[key] for key in DFLASH2_KEYS if key in spec})
    n = spec["num_layers"]
    config = {
        "architectures": [spec["architecture"]], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": None, "eos_token_id": shape.eos_token_id, "dflash_config": dflash,
        "dtype": "bfloat16", "head_dim": shape.head_dim, "hidden_act": "silu",
        "hidden_size": shape.hidden, "initializer_range": 0.02,
        "intermediate_size": spec.get("ffn", shape.ffn),
        "layer_types": ["full_attention"] * n, "max_position_embeddings": shape.max_positions,
        "max_window_layers": n, "model_type": "qwen3", "num_attention_heads": shape.n_head,
        "num_hidden_layers": n, "num_key_value_heads": shape.n_head_kv,
        "num_target_layers": shape.num_target_layers, "rms_norm_eps": shape.rms_eps,
        "rope_parameters": {"rope_theta": shape.rope_theta, "rope_type": "default"},
        "sliding_window": None, "tie_word_embeddings": False, "use_cache": True,
        "use_sliding_window": False, "vocab_size": shape.vocab,
    }
    variant = variant_of(spec)
    if variant is Variant.DFLASH:  # z-lab's DFlash 2 configs carry no auto_map; dflash.py is their remote code
        config["auto_map"] = {"AutoModel": f"dflash.{spec['architecture']}"}
    if variant is Variant.DSPARK:
        # DSpark's DFlash lineage: the settings at the top level, no dflash_config
        config.update(config.pop("dflash_config"), markov_head_type="vanilla",
                      markov_rank=spec["markov_rank"], has_confidence_head=True)
    return config


def drafter_class(architecture: str):
    return reference_class(ARCHITECTURES[architecture])


def new_drafter(config_dict: dict, seed: int):
    # extra: [reference], the z-lab model (PyTorch comes with [train])
    from transformers import Qwen3Config

    config = Qwen3Config(**config_dict)
    torch.manual_seed(seed)
    drafter = drafter_class(config_dict["architectures"][0])(config)
    if getattr(drafter, "markov_head", None) is not None:
        with torch.no_grad():
            drafter.markov_head.markov_w2.weight.zero_()  # no bias at the start: the DFlash layers alone
    for layer in drafter.layers:  # the reference leaves the conv base kernels uninitialised
        for conv in (layer.attention_conv, layer.mlp_conv):
            if conv is not None:
                with torch.no_grad():
                    conv.base_kernel.zero_()
                    conv.base_kernel[:, 0, :] = 1.0  # identity: y[t] = x[t] at the start
    for pname, param in drafter.named_parameters():
        if not torch.isfinite(param).all():
            raise RuntimeError(f"{pname} is not initialised")
    return drafter.float()


@torch.no_grad()
def init_from_target(drafter, target, feats: torch.Tensor) -> None:
    """Start the drafter's layers as the target layers that follow its deepest tapped one.

    The drafter's context is `hidden_norm(fc(taps))`; with `fc` picking the deepest tap (the output
    of target layer L) and `hidden_norm` the next layer's input norm, the context keys and values of
    the first drafter layer are exactly those target layer L+1 computes, and the head then reads the
    drafter's output as it reads the target's last layers'. What the copy cannot carry over: the
    drafter's Qwen3 attention normalises q and k per head (the target's llama attention does not),
    so their gains start at the typical q/k RMS the target layer has on `feats` (a sample of tapped
    states), which keeps the attention scores near the target's for tokens of typical size (a Qwen3
    target's own q/k norms are copied instead).
    """
    taps = list(drafter.target_layer_ids)
    hidden = drafter.config.hidden_size
    first = taps[-1] + 1
    sources = target.model.layers[first: first + len(drafter.layers)]
    if len(sources) != len(drafter.layers):
        raise ValueError(f"target layers {first}.. cannot seed {len(drafter.layers)} drafter layers")
    deepest = feats.reshape(-1, feats.shape[-1])[:, (len(taps) - 1) * hidden:].float()
    for mine, theirs in zip(drafter.layers, sources):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(mine.self_attn, name).weight.copy_(getattr(theirs.self_attn, name).weight)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(mine.mlp, name).weight.copy_(getattr(theirs.mlp, name).weight)
        mine.input_layernorm.weight.copy_(theirs.input_layernorm.weight)
        mine.post_attention_layernorm.weight.copy_(theirs.post_attention_layernorm.weight)
        x = theirs.input_layernorm(deepest.to(theirs.input_layernorm.weight.dtype))
        head_dim = mine.self_attn.head_dim
        for proj, norm, source in ((theirs.self_attn.q_proj, mine.self_attn.q_norm, "q_norm"),
                                   (theirs.self_attn.k_proj, mine.self_attn.k_norm, "k_norm")):
            if hasattr(theirs.self_attn, source):  # a Qwen3 target: the very norms
                norm.weight.copy_(getattr(theirs.self_attn, source).weight)
                continue
            rms = proj(x.to(proj.weight.dtype)).float().view(len(x), -1, head_dim).pow(2).mean(-1).sqrt()
            norm.weight.fill_(float(rms.mean()))
        for conv in (mine.attention_conv, mine.mlp_conv):
            if conv is not None:
                conv.kernel_projection.weight.zero_()  # the identity exactly, until trained
    drafter.fc.weight.zero_()
    drafter.fc.weight[:, (len(taps) - 1) * hidden:] = torch.eye(hidden)
    drafter.hidden_norm.weight.copy_(sources[0].input_layernorm.weight)
    drafter.norm.weight.copy_(target.model.norm.weight)


@torch.no_grad()
def teacher_top_k(finals: torch.Tensor, head, valid_from: torch.Tensor, valid_end: torch.Tensor,
                  k: int, chunk: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's k most likely next tokens at every position of `finals` [N, L, H] from
    `valid_from[i]` to `valid_end[i]` (exclusive), with their log-probabilities over the whole
    vocabulary: (ids [N, L, k] int32, log-probs [N, L, k] half; zeros elsewhere). One pass of the
    head over the distillation set, so that training needs the head only on a few thousand rows."""
    rows, length, _ = finals.shape
    ids = torch.zeros((rows, length, k), dtype=torch.int32)
    logp = torch.zeros((rows, length, k), dtype=torch.float16)
    where = torch.arange(length)[None] >= valid_from[:, None]
    where &= torch.arange(length)[None] < valid_end[:, None]
    flat = torch.nonzero(where)
    for start in range(0, len(flat), chunk):
        r, c = flat[start: start + chunk].unbind(1)
        scores = F.log_softmax(head(finals[r, c].to(head.weight.dtype)).float(), -1)
        top, top_ids = scores.topk(k, -1)
        ids[r, c], logp[r, c] = top_ids.int(), top.half()
    return ids, logp


def subset_logits(drafter, hidden, head, labels, data: DistillSet, seq, positions, negatives: int,
                  generator):
    """Sampled softmax: the drafter's logits over a few thousand rows of the head, not all of them:
    the target's top-k at the batch's label positions, the labels, and `negatives` tokens drawn
    uniformly from the rest, whose logits carry log(rest / drawn) so that each stands for the
    tokens not drawn (the softmax's normaliser stays an unbiased estimate). Returns the raw
    logits [B, P, C] (what the head gives those rows), the logits the softmax reads, the vocabulary
    ids of the C columns, and the column of every label and of every teacher top-k token."""
    vocab = head.weight.shape[0]
    labels = labels.cpu()  # the columns are chosen where the data and the generator are
    top = data.teacher_ids[seq[:, None, None], positions].reshape(*labels.shape, -1).long()
    wanted = torch.unique(torch.cat([top.flatten(), labels.flatten()]))
    drawn = torch.randint(0, vocab, (negatives,), generator=generator).unique()
    drawn = drawn[~torch.isin(drawn, wanted)]
    columns = torch.cat([wanted, drawn])
    correction = torch.zeros(len(columns))
    if len(drawn):
        correction[len(wanted):] = math.log((vocab - len(wanted)) / len(drawn))
    where = torch.full((vocab,), -1, dtype=torch.long)
    where[columns] = torch.arange(len(columns))
    device = hidden.device
    columns = columns.to(device)
    raw = drafter.compute_logits(hidden, lambda h: F.linear(h, head.weight[columns]))
    return (raw, raw.float() + correction.to(device), columns, where[labels].to(device),
            where[top].to(device))


def save_drafter(drafter, folder: Path, config_dict: dict) -> None:
    """config.json + model.safetensors, bf16, the codebooks named without `.weight` as z-lab ships."""

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for key, value in drafter.state_dict().items():
        if key.endswith("rotary_emb.inv_freq"):
            continue
        if key.startswith("candidate_selector.") and key.endswith("_codebook.weight"):
            key = key[: -len(".weight")]
        tensors[key] = value.detach().to(torch.bfloat16).cpu().contiguous()
    save_file(dict(sorted(tensors.items())), folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "model.safetensors").chmod(0o644)  # safetensors writes it private to its owner
    write_json(folder / "config.json", config_dict)


def load_drafter(folder: Path):
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    drafter = drafter_class(config["architectures"][0]).from_pretrained(folder, dtype=torch.float32)
    return drafter.eval().requires_grad_(False)


def anchor_batch(data: DistillSet, seqs: int, anchors_per_seq: int, generator):
    """Training sequences and anchors [seqs, anchors_per_seq]: each block's first token is the
    anchor (a real token of the continuation), its other positions are masks whose labels are the
    target's own greedy tokens. Anchors run from the last prompt token to the last one that still
    has a label after it."""
    usable = torch.nonzero(data.valid_end - 1 - data.first_anchor > 0)[:, 0]
    seq = usable[torch.randint(0, len(usable), (seqs,), generator=generator)]
    low = data.first_anchor[seq]
    span = (data.valid_end[seq] - 1 - low).float()
    anchors = low[:, None] + (torch.rand(seqs, anchors_per_seq, generator=generator) * span[:, None]).long()
    return seq, anchors


def block_tokens(ids, valid_end, seq, anchors, length):
    """The real tokens from each anchor on, [rows, n, length], and whether each is a label (before
    the sequence's end)."""
    positions = anchors[..., None] + torch.arange(length)
    tokens = ids[seq[:, None, None], positions.clamp(max=ids.shape[1] - 1)]
    return tokens, positions < valid_end[seq][:, None, None]


def block_hidden(drafter, target, feats, seq, anchors, block_ids, mask_token_id: int):
    """The drafter's hidden states [rows * n, block, H] for blocks `[anchor token, mask x (block-1)]`
    at the anchors' positions, each seeing the target features before its anchor and its own block.
    Indices and features are gathered where the data lives (the CPU); what the drafter reads moves
    to the drafter's device."""
    device = target.get_input_embeddings().weight.device
    rows, n, block = block_ids.shape
    ctx_len = int(anchors.max())
    positions = anchors[..., None] + torch.arange(block)
    noise_ids = torch.full_like(block_ids, mask_token_id)
    noise_ids[..., 0] = block_ids[..., 0]
    noise_embedding = F.embedding(noise_ids.view(rows, n * block).to(device), target.get_input_embeddings().weight)
    context = feats[seq, :ctx_len].to(device).float()
    position_ids = torch.cat([torch.arange(ctx_len).expand(rows, -1), positions.view(rows, -1)], 1)
    visible_ctx = (torch.arange(ctx_len) < anchors[..., None]).repeat_interleave(block, dim=1)
    block_of = torch.arange(n * block) // block
    visible_blocks = (block_of[:, None] == block_of[None, :]).expand(rows, -1, -1)
    mask = torch.cat([visible_ctx, visible_blocks], -1)[:, None]  # [rows, 1, n*block, ctx+n*block]

    hidden = drafter(position_ids=position_ids.to(device), attention_mask=mask.to(device),
                     noise_embedding=noise_embedding, target_hidden=context)
    return hidden.view(rows * n, block, -1)


def dspark_loss(drafter, target, data: DistillSet, seq, anchors, spec):
    """DSpark's anchor-first loss: the same blocks as DFlash (packed per sequence), but block
    position i predicts the token *after* it (position 0, the anchor, drafts the first token), with
    the Markov bias of the true token at position i (teacher forcing; at run time the chain's own
    argmax, equal to it while everything before was accepted). The confidence head learns whether
    position i's argmax is right, from the detached hidden state and the previous token's
    markov_w1 row (not detached: its loss trains markov_w1 too); the loss weights decay as DFlash's."""
    block = spec["block_size"]
    tokens, is_label = block_tokens(data.ids, data.valid_end, seq, anchors, block + 1)
    hidden = block_hidden(drafter, target, data.feats, seq, anchors, tokens[..., :block], data.mask_token_id)
    tokens, is_label = tokens.to(hidden.device), is_label.to(hidden.device)
    previous = tokens[..., :block].reshape(-1, block)
    labels = tokens[..., 1:].reshape(-1, block)
    ok = is_label[..., 1:].reshape(-1, block).float()
    logits = drafter.position_logits(hidden, previous, target.lm_head)
    weights = torch.exp(-torch.arange(block, dtype=torch.float32, device=ok.device) / spec["gamma"])[None] * ok
    ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view_as(ok)
    loss = (ce * weights).sum() / weights.sum().clamp_min(1e-6)
    hit = (logits.argmax(-1) == labels).float().detach()
    confidence = drafter.confidence_logit(hidden.detach(), previous)
    conf_loss = ((F.binary_cross_entropy_with_logits(confidence, hit, reduction="none") * ok).sum()
                 / ok.sum().clamp_min(1))
    with torch.no_grad():
        stats = {"ce": loss.item(), "acc": ((hit * ok).sum() / ok.sum().clamp_min(1)).item(),
                 "accept": ((hit * ok).cumprod(1)).sum(1).mean().item(), "conf": conf_loss.item()}
    return loss + conf_loss, stats


def drafter_loss(drafter, target, data: DistillSet, seq, anchors, spec, generator=None):
    """Block-diffusion loss of the reference recipe.

    Every block's draft queries see the target's features at positions < anchor and their own
    block, bidirectionally (the reference's non-causal attention), which is exactly the view
    `dflash_generate` gives them. DFlash packs a sequence's blocks into one row behind its context
    (blocks invisible to each other); DFlash 2 gives every block a row of its own, so that its
    causal convolutions, which run along the row, never cross from one block into the next.
    """
    variant = variant_of(spec)
    if variant is Variant.DSPARK:
        return dspark_loss(drafter, target, data, seq, anchors, spec)
    block = spec["block_size"]
    if variant is Variant.DFLASH2:
        seq = seq.repeat_interleave(anchors.shape[1])
        anchors = anchors.reshape(-1, 1)
    block_ids, label_ok = block_tokens(data.ids, data.valid_end, seq, anchors, block)
    label_ok &= torch.arange(block) > 0
    hidden = block_hidden(drafter, target, data.feats, seq, anchors, block_ids, data.mask_token_id)[:, 1:]
    device = hidden.device
    rows, n = anchors.shape
    block_ids = block_ids.view(rows * n, block).to(device)
    label_ok = label_ok.view(rows * n, block).to(device)
    head = target.lm_head
    labels = block_ids[:, 1:]
    ok = label_ok[:, 1:].float()
    weights = torch.exp(-torch.arange(block - 1, dtype=torch.float32, device=device) / spec["gamma"])[None] * ok
    # the position of each label's prediction in the distillation set: the target's state there
    positions = (anchors[..., None] + torch.arange(block - 1)).clamp(max=data.feats.shape[1] - 1)
    negatives = spec.get("sampled_softmax")
    columns = None
    if negatives:
        if data.teacher_ids is None:
            raise ValueError("sampled_softmax needs the target's top-k (DistillSet.teacher_ids)")
        logits, scores, columns, label_col, top_col = subset_logits(
            drafter, hidden, head, labels, data, seq, positions, negatives, generator)
        log_probs = F.log_softmax(scores, -1)
        ce = -log_probs.gather(-1, label_col[..., None])[..., 0]
    else:
        logits = drafter.compute_logits(hidden, head)  # [B, block-1, V]
        log_probs = F.log_softmax(logits.float(), -1)
        ce = -log_probs.gather(-1, labels[..., None])[..., 0]
    soft, feature = spec.get("soft_labels", 0.0), spec.get("feature_loss", 0.0)
    if soft and columns is not None:
        # the target's top-k probabilities (of the whole vocabulary) against the drafter's
        probs = data.teacher_logp[seq[:, None, None], positions].reshape(*top_col.shape).to(device).float().exp()
        ce = (1 - soft) * ce - soft * (probs * log_probs.gather(-1, top_col)).sum(-1)
    if (soft and columns is None) or feature:
        if data.finals is None:
            raise ValueError("soft_labels and feature_loss need the target's final states (DistillSet.finals)")
        # the target's final (normed) state at each label's position: through the head, its whole
        # next-token distribution, not only its argmax
        finals = data.finals[seq[:, None, None], positions].reshape(rows * n, block - 1, -1).to(device)
        if soft and columns is None:
            with torch.no_grad():
                probs = F.softmax(head(finals.to(head.weight.dtype)).float(), -1)
            ce = (1 - soft) * ce - soft * (probs * log_probs).sum(-1)
        if feature:
            # EAGLE's feature regression: the drafter's output state against the target's, both
            # read by the same head; a dense signal per label
            ce = ce + feature * F.smooth_l1_loss(hidden.float(), finals.float(), reduction="none").mean(-1)
    loss = (ce * weights).sum() / weights.sum().clamp_min(1e-6)
    with torch.no_grad():
        best = logits.argmax(-1)
        hit = ((best if columns is None else columns[best]) == labels).float() * ok
        accept = (hit.cumprod(1) * ok).sum(1).mean().item()  # accepted drafts per block, teacher-forced
        stats = {"ce": loss.item(), "acc": (hit.sum() / ok.sum().clamp_min(1)).item(), "accept": accept}

    if variant is Variant.DFLASH2:
        # Candidate selector: among the draft's top_k, pick the target's next token given the
        # previous one (the anchor for position 1, then the true path; at inference the path is the
        # drafter's own choice, equal to the truth as long as everything before was accepted).
        selector = drafter.candidate_selector
        unary, candidates = torch.topk(logits, selector.top_k, dim=-1)
        if columns is not None:
            candidates = columns[candidates]
        projected = selector.hidden_projection(hidden)
        previous = block_ids[:, :-1]
        pair = torch.einsum("bpr,bpkr->bpk", selector.predecessor_codebook(previous) * projected,
                            selector.successor_codebook(candidates))
        scores = unary + pair
        is_label = candidates == labels[..., None]
        present = is_label.any(-1).float() * ok
        sel_ce = F.cross_entropy(scores.flatten(0, 1), is_label.float().argmax(-1).flatten(),
                                 reduction="none").view_as(ok)
        sel_w = weights * present
        sel_loss = (sel_ce * sel_w).sum() / sel_w.sum().clamp_min(1e-6)
        loss = loss + sel_loss
        with torch.no_grad():
            picked = candidates.gather(-1, scores.argmax(-1, keepdim=True))[..., 0]
            sel_hit = (picked == labels).float() * ok
            stats.update(sel=sel_loss.item(), sel_acc=(sel_hit.sum() / ok.sum().clamp_min(1)).item(),
                         sel_accept=(sel_hit.cumprod(1) * ok).sum(1).mean().item())
    return loss, stats




def _log_progress(name: str):
    """The recipes' progress: a line every 25 steps."""
    def report(step: int, steps: int | None, running: dict, seconds: float, first: int) -> None:
        if steps is not None and (step % 25 == 0 or step == steps - 1):
            shown = " ".join(f"{k} {v:.3f}" for k, v in running.items())
            eta = seconds / (step + 1 - first) * (steps - step - 1)
            log(f"{name} step {step}/{steps} {shown} ({seconds:.0f} s, ~{eta / 60:.0f} min left)")
    return report


RESIZE_EVERY = 25  # steps between re-sizings of a timed run, from the pace of the last ones


def _sized(budget: float, spent: float, step: int, pace: deque) -> int:
    """The step count that ends a timed run at its budget at the pace of the last steps: the load of a
    shared machine changes while it trains, so the pace of the first steps alone overshoots or
    undershoots (a 10-minute run sized on a loaded start was still going after 16 minutes)."""
    (t0, s0), (t1, s1) = pace[0], pace[-1]
    per_step = (t1 - t0) / (s1 - s0) if s1 > s0 and t1 > t0 else None
    if per_step is None:
        return step + 1
    return max(step + 1, step + int(max(0.0, budget - spent) / per_step))


@dataclass(frozen=True)
class TrainingRun:
    """How train_drafter runs: `name` (its log lines'), `seed` (the batches'), how long (`steps`, or
    `budget_seconds`), where and how often it checkpoints, `deadline` and `bf16` (train_drafter says how
    each is used)."""

    name: str
    seed: int
    steps: int | None = None
    budget_seconds: float | None = None
    checkpoint: Path | None = None
    checkpoint_every: int = 50
    checkpoint_seconds: float | None = None
    deadline: float | None = None
    bf16: bool = False


def train_drafter(drafter, target, data: DistillSet, spec: dict, run: TrainingRun, progress=None):
    """AdamW on the drafter alone (the target's embeddings and head stay frozen), lr warm-up then
    cosine to 10 %, clip 1.0. With `run.checkpoint`, the drafter, optimizer, batch generator and
    running statistics are saved every `run.checkpoint_every` steps (or `run.checkpoint_seconds`) and a
    rerun continues from the last one, with the same result as a run that was never stopped.
    `run.bf16` runs the forward under bf16 autocast on the drafter's device (weights, optimizer and loss
    reductions stay float32). `run.deadline` (time.time() seconds) stops the loop early, after a checkpoint; the
    steps done are in `drafter.trained_steps`. `run.budget_seconds` instead of `run.steps`: the step count is set
    from the speed of the warm-up steps (which do not depend on it) so that the run takes about that
    long, then re-sized every RESIZE_EVERY steps from the pace of the last ones so that the run ends
    at its budget whatever the load does meanwhile; the count is kept in the checkpoint. `progress(step, steps, running, seconds, first)` is called
    after every step (default: a log line every 25); `steps` is None until a budget has sized it."""
    name, checkpoint, budget_seconds = run.name, run.checkpoint, run.budget_seconds
    steps = run.steps  # sized from the budget as the run goes, when it is None
    warmup = 50
    device_type = next(drafter.parameters()).device.type
    drafter.train()
    progress = progress or _log_progress(name)
    decay = [p for n, p in drafter.named_parameters() if p.ndim >= 2 and "base_kernel" not in n]
    no_decay = [p for n, p in drafter.named_parameters() if p.ndim < 2 or "base_kernel" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=spec["lr"], betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(run.seed)
    running: dict[str, float] = {}
    first, spent = 0, 0.0  # steps and seconds before this process (a resumed run)
    if checkpoint is not None and checkpoint.is_file():
        state = torch.load(checkpoint, weights_only=False)
        if state["steps"] == steps or (steps is None and state.get("budget") == budget_seconds):
            steps = state["steps"]
            drafter.load_state_dict(state["drafter"])
            optimizer.load_state_dict(state["optimizer"])
            generator.set_state(state["generator"])
            running, first, spent = state["running"], state["step"], state.get("seconds", 0.0)
            log(f"{name}: resuming at step {first}/{steps} from {checkpoint}")
    params = sum(p.numel() for p in drafter.parameters())
    log(f"{name}: {params / 1e6:.2f} M parameters, {steps or 'timed'} steps, "
        f"{spec['seqs_per_step']}x{spec['anchors_per_seq']} blocks of {spec['block_size']}")
    started = last_save = time.time()
    done_steps, step = first, first
    pace: deque[tuple[float, int]] = deque([(started, first)], maxlen=RESIZE_EVERY + 1)
    rates: list[float] = []  # steps per second, per RESIZE_EVERY steps: how the machine's load moved the pace

    def save(step_done: int) -> None:
        tmp = checkpoint.with_suffix(".partial")
        torch.save({"steps": steps, "budget": budget_seconds, "step": step_done, "drafter": drafter.state_dict(),
                    "optimizer": optimizer.state_dict(), "generator": generator.get_state(),
                    "running": running, "seconds": spent + time.time() - started}, tmp)
        tmp.replace(checkpoint)

    while steps is None or step < steps:
        if run.deadline is not None and time.time() > run.deadline:
            log(f"{name}: deadline reached after {step} of {steps} steps")
            break
        if budget_seconds is not None and step - first + 1 >= min(warmup, 20) and (
                steps is None or (step - first) % RESIZE_EVERY == 0):
            steps = _sized(budget_seconds, spent + time.time() - started, step, pace)
        seq, anchors = anchor_batch(data, spec["seqs_per_step"], spec["anchors_per_seq"], generator)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps or 10 ** 9, spec["lr"], warmup)
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=run.bf16):
            loss, stats = drafter_loss(drafter, target, data, seq, anchors, spec, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        optimizer.step()
        for key, value in stats.items():
            running[key] = 0.9 * running.get(key, value) + 0.1 * value
        step += 1
        done_steps = step
        pace.append((time.time(), step))
        if (step - first) % RESIZE_EVERY == 0 and pace[-1][0] > pace[0][0]:
            rates.append((pace[-1][1] - pace[0][1]) / (pace[-1][0] - pace[0][0]))
        progress(step - 1, steps, running, time.time() - started, first)  # steps None: not sized yet
        if checkpoint is not None and steps is not None:
            due = (time.time() - last_save >= run.checkpoint_seconds if run.checkpoint_seconds is not None
                   else step % run.checkpoint_every == 0)
            if due or step == steps:
                save(step)
                last_save = time.time()
    log(f"{name}: trained in {time.time() - started:.0f} s")
    drafter.trained_steps = done_steps
    drafter.trained_seconds = spent + time.time() - started  # across every process of a resumed run
    drafter.step_rates = (min(rates), max(rates)) if rates else None  # this process's
    return drafter.eval()


@torch.inference_mode()
def replay_acceptance(drafter, target, ids: list[int], feats: torch.Tensor, prompt_len: int,
                      max_new: int, spec: dict, mask_token_id: int, stop_ids: list[int]) -> list[int]:
    """`dflash_generate`'s acceptance lengths at temperature 0 for one prompt, replayed on the
    target's greedy output `ids` (prompt + answer) and its features (`feats[i]`: token i's): at
    temperature 0 the output is the target's greedy path whatever the drafter does, so each step's
    draft depends only on where the step starts. Every possible block (one per answer position) is
    drafted in one batched pass through `block_hidden`, the view `dflash_generate` gives the
    drafter; the walk then applies its acceptance rule. One difference: `dflash_generate` drafts
    the last block of a run shorter when fewer than `block_size` tokens remain; here it is drafted
    at full length and cut."""
    block = spec["block_size"]
    n = len(ids)
    anchors = torch.arange(prompt_len, max(prompt_len + 1, n - 1))
    data = DistillSet(ids=torch.tensor([ids]), feats=feats[None], valid_end=torch.tensor([n]),
                      first_anchor=torch.tensor([prompt_len]), mask_token_id=mask_token_id)
    if variant_of(spec) is Variant.DFLASH2:
        seq, anchor_grid = torch.zeros(len(anchors), dtype=torch.long), anchors[:, None]
    else:
        seq, anchor_grid = torch.zeros(1, dtype=torch.long), anchors[None]
    block_ids, _ = block_tokens(data.ids, data.valid_end, seq, anchor_grid, block)
    hidden = block_hidden(drafter, target, data.feats, seq, anchor_grid, block_ids, mask_token_id)[:, 1:]
    first = block_ids.reshape(-1, block)[:, 0]
    if hasattr(drafter, "propose"):
        drafts = drafter.propose(hidden, first, target.lm_head, 0.0)[0]
    else:
        drafts = drafter.compute_logits(hidden, target.lm_head).argmax(-1)
    max_length = prompt_len + max_new
    lengths, start = [], prompt_len
    stopped = ids[start] in stop_ids
    while start + 1 < max_length and start + 1 < n and not stopped:
        verify = min(block, max_length - start)
        draft = drafts[start - prompt_len, : verify - 1].tolist()
        truth = ids[start + 1: start + verify]
        accepted = 0
        while accepted < min(len(draft), len(truth)) and draft[accepted] == truth[accepted]:
            accepted += 1
        produced = min(accepted + 1, max_length - start - 1)
        made = ids[start + 1: start + produced + 1]
        if any(t in stop_ids for t in made):
            produced = next(i for i, t in enumerate(made) if t in stop_ids) + 1
            stopped = True
        start += produced
        lengths.append(produced)
    return lengths
