"""Train a small target and its DFlash / DFlash 2 drafters offline, on CPU, from a fixed seed.

    python -m training.train_pair                 # every stage, in order
    python -m training.train_pair --stage eval    # one stage (they read what earlier ones wrote)

Stages (see training/README.md for the recipe, the seeds and measured run times):

    tokenizer  byte-level BPE (Qwen2 pre-tokenizer) trained on this machine's CPython stdlib *.py
    target     a Qwen3ForCausalLM trained from scratch on the same stdlib source
    distill    the frozen target's greedy continuations of stdlib prompts, with the hidden
               states the drafters read (cached outside the repository, not committed)
    dflash     DFlashDraftModel trained against the frozen target (the reference class itself)
    dflash2    DFlash2DraftModel, the same plus its convolutions and candidate selector
    dspark     DSparkDraftModel (dflash_gguf.validation.dspark_reference): DFlash layers, anchor-first,
               plus a Markov head and a confidence head
    greedy     the target's greedy tokens for three held-out prompts -> greedy.json (for the tests)
    eval       tau (tokens per target verification) of the drafters with the reference
               `dflash_generate` (DSpark: `dspark_generate`), greedy, 128 new tokens, on the
               held-out prompts (`--drafter NAME`: one drafter, its entry of reference_tau.json only)

Everything lands under tests/fixtures/trained/ in the z-lab layout: target/ (config, bf16
safetensors, tokenizer), dflash/, dflash2/ and dspark/ (config.json + model.safetensors only: drafters own no
embeddings, head or tokenizer; they borrow the target's, frozen). Held-out prompts are the opening
tokens of third-party modules (EVAL_PROMPT_SOURCES), never stdlib files; they are written once to
eval_prompts.json so the evaluation does not depend on which package versions are installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dflash_gguf.train import recipe
from dflash_gguf.train.recipe import DistillSet, DrafterShape, log, lr_at
from dflash_gguf.train.recipe import write_json as _write_json

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "fixtures" / "trained"
SEED = 20261129

# --- tokenizer -----------------------------------------------------------------------------
VOCAB_SIZE = 4096  # embedding rows: BPE tokens, special tokens, spare rows (as Qwen3 pads its own)
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|file_sep|>",
)
SPARE_ROWS = 8
BPE_SIZE = VOCAB_SIZE - len(SPECIAL_TOKENS) - SPARE_ROWS  # 4080, the 256 byte symbols included
EOS_TOKEN_ID = BPE_SIZE  # <|endoftext|>: eos and pad
MASK_TOKEN_ID = BPE_SIZE + len(SPECIAL_TOKENS)  # first spare row, no token (as z-lab's 151669)

# --- target --------------------------------------------------------------------------------
HIDDEN_SIZE = 256
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 64
TARGET_LAYERS = 6
TARGET_FFN = 768
ROPE_THETA = 10_000.0
RMS_EPS = 1e-6
MAX_POSITIONS = 2048
TARGET_SEQ_LEN = 256
TARGET_BATCH = 16
TARGET_STEPS = 320
TARGET_LR = 3e-3

# --- self-distillation data ----------------------------------------------------------------
PROMPT_TOKENS = 64  # training prompts and held-out prompts alike
DISTILL_NEW_TOKENS = 160
DISTILL_SEQUENCES = 1536
DISTILL_BATCH = 64
TARGET_LAYER_IDS = [0, 2, 4]  # HF hidden_states[id + 1]; llama.cpp's dflash.target_layers = id + 1

# --- drafters ------------------------------------------------------------------------------
DRAFTERS = {
    "dflash": {
        "architecture": "DFlashDraftModel", "num_layers": 2, "block_size": 16,
        "steps": 800, "seqs_per_step": 4, "anchors_per_seq": 12, "lr": 1.5e-3, "gamma": 7.0,
    },
    "dflash2": {
        "architecture": "DFlash2DraftModel", "num_layers": 2, "block_size": 8,
        "steps": 800, "seqs_per_step": 4, "anchors_per_seq": 12, "lr": 1.5e-3, "gamma": 4.0,
        # llama.cpp: n_embd % conv_group_size == 0 and n_embd >= top_k * (top_k + 1)
        "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 32, "selector_top_k": 8,
    },
    # deepseek-ai/dspark_qwen3_4b_block7's lineage: block 7, anchor-first (7 drafts per block)
    "dspark": {
        "architecture": "DSparkDraftModel", "num_layers": 2, "block_size": 7,
        "steps": 400, "seqs_per_step": 4, "anchors_per_seq": 12, "lr": 1.5e-3, "gamma": 4.0,
        "markov_rank": 32,
    },
}
SHAPE = DrafterShape(
    hidden=HIDDEN_SIZE, n_head=NUM_HEADS, n_head_kv=NUM_KV_HEADS, head_dim=HEAD_DIM, ffn=TARGET_FFN,
    vocab=VOCAB_SIZE, rope_theta=ROPE_THETA, rms_eps=RMS_EPS, max_positions=MAX_POSITIONS,
    num_target_layers=TARGET_LAYERS, target_layer_ids=tuple(TARGET_LAYER_IDS),
    mask_token_id=MASK_TOKEN_ID, eos_token_id=EOS_TOKEN_ID)

# --- held-out evaluation -------------------------------------------------------------------
# Opening tokens of modules that are not in the stdlib (found through importlib in this venv).
EVAL_PROMPT_SOURCES = (
    "click/core.py",
    "numpy/linalg/_linalg.py",
    "numpy/lib/_npyio_impl.py",
    "safetensors/torch.py",
    "jinja2/environment.py",
    "pygments/lexer.py",
    "packaging/version.py",
    "huggingface_hub/hf_api.py",
    "pydantic/main.py",
    "networkx/classes/graph.py",
    "markdown_it/main.py",
    "certifi/core.py",
)
EVAL_NEW_TOKENS = 128
GREEDY_PROMPTS = 3
GREEDY_NEW_TOKENS = 32


def work_dir() -> Path:
    """Intermediate data (token stream, distillation set): outside the repository."""
    from dflash_gguf.paths import cache_dir

    folder = cache_dir() / "training"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# --- corpus --------------------------------------------------------------------------------

def stdlib_files() -> list[Path]:
    """Every *.py of this CPython's standard library, sorted, that decodes as UTF-8."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "dist-packages" in path.parts:
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if text.strip():
            files.append(path)
    return files


def stdlib_texts() -> list[str]:
    return [path.read_text(encoding="utf-8") for path in stdlib_files()]


# --- stage: tokenizer ----------------------------------------------------------------------

def train_tokenizer(texts: list[str]):
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers

    from training.fixtures.qwen2_style import qwen2_style

    tokenizer = qwen2_style(Tokenizer(models.BPE()))
    trainer = trainers.BpeTrainer(vocab_size=BPE_SIZE, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    if tokenizer.get_vocab_size() != BPE_SIZE:
        raise RuntimeError(f"BPE vocabulary came out at {tokenizer.get_vocab_size()}, not {BPE_SIZE}")
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t in SPECIAL_TOKENS])
    return tokenizer


def write_tokenizer(tokenizer, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    added = {
        str(BPE_SIZE + i): {"content": token, "lstrip": False, "normalized": False,
                            "rstrip": False, "single_word": False, "special": True}
        for i, token in enumerate(SPECIAL_TOKENS)
    }
    _write_json(folder / "tokenizer_config.json", {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
        "additional_special_tokens": list(SPECIAL_TOKENS[1:]), "bos_token": None,
        "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>", "errors": "replace",
        "model_max_length": MAX_POSITIONS, "pad_token": "<|endoftext|>",
        "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    })


def stage_tokenizer() -> None:
    texts = stdlib_texts()
    log(f"tokenizer: {len(texts)} stdlib files, {sum(map(len, texts)) / 1e6:.1f} M characters")
    tokenizer = train_tokenizer(texts)
    write_tokenizer(tokenizer, OUT / "target")
    encoded = tokenizer.encode_batch(texts, add_special_tokens=False)
    stream = []
    starts = []
    for enc in encoded:
        starts.append(len(stream))
        stream.extend(enc.ids)
        stream.append(EOS_TOKEN_ID)
    torch.save({"stream": torch.tensor(stream, dtype=torch.int16),
                "starts": torch.tensor(starts, dtype=torch.int64)}, work_dir() / "stdlib_tokens.pt")
    log(f"tokenizer: vocabulary {tokenizer.get_vocab_size()} (+{SPARE_ROWS} spare rows), "
        f"stdlib = {len(stream) / 1e6:.2f} M tokens, {sum(map(len, texts)) / len(stream):.2f} chars/token")


def load_tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(OUT / "target" / "tokenizer.json"))


# --- stage: target -------------------------------------------------------------------------

def target_config():
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=VOCAB_SIZE, hidden_size=HIDDEN_SIZE, intermediate_size=TARGET_FFN,
        num_hidden_layers=TARGET_LAYERS, num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS, head_dim=HEAD_DIM, hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS, initializer_range=0.02, rms_norm_eps=RMS_EPS,
        use_cache=True, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        attention_bias=False, attention_dropout=0.0, use_sliding_window=False,
        sliding_window=None, max_window_layers=TARGET_LAYERS, bos_token_id=None,
        eos_token_id=EOS_TOKEN_ID, pad_token_id=EOS_TOKEN_ID,
        architectures=["Qwen3ForCausalLM"],
    )


def stage_target(steps: int = TARGET_STEPS) -> None:
    from transformers import GenerationConfig, Qwen3ForCausalLM

    data = torch.load(work_dir() / "stdlib_tokens.pt")
    stream, starts = data["stream"].long(), data["starts"]
    starts = starts[starts < len(stream) - TARGET_SEQ_LEN - 1]
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED + 1)
    model = Qwen3ForCausalLM(target_config())
    model.train()
    params = sum(p.numel() for p in model.parameters())
    log(f"target: {params / 1e6:.2f} M parameters, {steps} steps of {TARGET_BATCH}x{TARGET_SEQ_LEN} tokens")
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=TARGET_LR, betas=(0.9, 0.95))
    started = time.time()
    for step in range(steps):
        # A quarter of the windows open at a file start: held-out prompts are module openings.
        at_start = torch.rand(TARGET_BATCH, generator=generator) < 0.25
        random_offsets = torch.randint(0, len(stream) - TARGET_SEQ_LEN - 1, (TARGET_BATCH,), generator=generator)
        file_offsets = starts[torch.randint(0, len(starts), (TARGET_BATCH,), generator=generator)]
        offsets = torch.where(at_start, file_offsets, random_offsets)
        batch = torch.stack([stream[o:o + TARGET_SEQ_LEN] for o in offsets.tolist()])
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, TARGET_LR, 40)
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 25 == 0 or step == steps - 1:
            elapsed = time.time() - started
            log(f"target step {step}/{steps} loss {loss.item():.3f} "
                f"({elapsed:.0f} s, {(step + 1) * TARGET_BATCH * TARGET_SEQ_LEN / elapsed:.0f} tok/s)")
    log(f"target: trained in {time.time() - started:.0f} s")
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=EOS_TOKEN_ID, pad_token_id=EOS_TOKEN_ID,
                                               do_sample=False)
    model.save_pretrained(OUT / "target")
    for path in (OUT / "target").iterdir():
        path.chmod(0o644)  # save_pretrained leaves the weights private to their owner


def load_target():
    from transformers import Qwen3ForCausalLM

    target = Qwen3ForCausalLM.from_pretrained(OUT / "target", dtype=torch.float32)
    target.eval().requires_grad_(False)
    return target


# --- stage: distill ------------------------------------------------------------------------

def distill_prompts() -> torch.Tensor:
    """DISTILL_SEQUENCES prompts of PROMPT_TOKENS tokens: half file openings, half random places."""
    data = torch.load(work_dir() / "stdlib_tokens.pt")
    stream, starts = data["stream"].long(), data["starts"]
    ends = torch.cat([starts[1:] - 1, torch.tensor([len(stream) - 1])])
    generator = torch.Generator().manual_seed(SEED + 2)
    long_enough = starts[(ends - starts) >= PROMPT_TOKENS]
    order = torch.randperm(len(long_enough), generator=generator)
    openings = long_enough[order[: DISTILL_SEQUENCES // 2]]
    anywhere = torch.randint(0, len(stream) - PROMPT_TOKENS, (DISTILL_SEQUENCES - len(openings),),
                             generator=generator)
    offsets = torch.cat([openings, anywhere])
    return torch.stack([stream[o:o + PROMPT_TOKENS] for o in offsets.tolist()])


@torch.inference_mode()
def greedy_with_features(target, prompts: torch.Tensor, new_tokens: int):
    """Greedy continuation (batched, KV cache) and the tapped hidden states of every input token."""
    from dflash.model import extract_context_feature
    from transformers import DynamicCache

    cache = DynamicCache(config=target.config)
    out = target(prompts, past_key_values=cache, use_cache=True, output_hidden_states=True,
                 logits_to_keep=1)
    feats = [extract_context_feature(out.hidden_states, TARGET_LAYER_IDS).half()]
    token = out.logits[:, -1].argmax(-1)
    tokens = [prompts, token[:, None]]
    for _ in range(new_tokens - 1):
        out = target(token[:, None], past_key_values=cache, use_cache=True, output_hidden_states=True)
        feats.append(extract_context_feature(out.hidden_states, TARGET_LAYER_IDS).half())
        token = out.logits[:, -1].argmax(-1)
        tokens.append(token[:, None])
    return torch.cat(tokens, 1), torch.cat(feats, 1)


def stage_distill() -> None:
    target = load_target()
    prompts = distill_prompts()
    started = time.time()
    all_ids, all_feats = [], []
    for i in range(0, len(prompts), DISTILL_BATCH):
        ids, feats = greedy_with_features(target, prompts[i:i + DISTILL_BATCH], DISTILL_NEW_TOKENS)
        all_ids.append(ids.to(torch.int16))
        all_feats.append(feats)
        log(f"distill: {i + len(ids)}/{len(prompts)} sequences ({time.time() - started:.0f} s)")
    ids = torch.cat(all_ids)
    torch.save({"ids": ids, "feats": torch.cat(all_feats), "prompt_tokens": PROMPT_TOKENS,
                "target_layer_ids": TARGET_LAYER_IDS}, work_dir() / "distill.pt")
    eos_rate = (ids[:, PROMPT_TOKENS:] == EOS_TOKEN_ID).any(1).float().mean().item()
    log(f"distill: {len(ids)} sequences of {ids.shape[1]} tokens in {time.time() - started:.0f} s "
        f"({eos_rate:.0%} reach <|endoftext|>)")


# --- stages: dflash, dflash2, dspark (train/recipe.py) ---------------------------

def drafter_config_dict(name: str) -> dict:
    return recipe.drafter_config_dict(DRAFTERS[name], SHAPE)


def new_drafter(name: str):
    return recipe.new_drafter(drafter_config_dict(name), SEED + 10 + list(DRAFTERS).index(name))


def save_drafter(drafter, name: str) -> None:
    recipe.save_drafter(drafter, OUT / name, drafter_config_dict(name))


def load_drafter(name: str):
    return recipe.load_drafter(OUT / name)


def load_distill() -> DistillSet:
    data = torch.load(work_dir() / "distill.pt")
    if data["target_layer_ids"] != TARGET_LAYER_IDS or data["prompt_tokens"] != PROMPT_TOKENS:
        raise RuntimeError("distill.pt was made with other settings: rerun --stage distill")
    ids = data["ids"].long()
    feats = data["feats"]
    # Labels run to the first <|endoftext|> of the continuation (included), never past it.
    cont = ids[:, PROMPT_TOKENS:] == EOS_TOKEN_ID
    first_eos = torch.where(cont.any(1), cont.float().argmax(1) + PROMPT_TOKENS + 1,
                            torch.full((len(ids),), ids.shape[1]))
    valid_end = first_eos.clamp(max=feats.shape[1])  # features exist for ids[:, :-1]
    return DistillSet(ids=ids, feats=feats, valid_end=valid_end,
                      first_anchor=torch.full((len(ids),), PROMPT_TOKENS - 1), mask_token_id=MASK_TOKEN_ID)


def stage_drafter(name: str, steps: int | None = None) -> None:
    spec = DRAFTERS[name]
    run = recipe.TrainingRun(name=name, seed=SEED + 20 + list(DRAFTERS).index(name), steps=steps or spec["steps"])
    drafter = recipe.train_drafter(new_drafter(name), load_target(), load_distill(), spec, run)
    save_drafter(drafter, name)


# --- held-out prompts, greedy record, evaluation ---------------------------------------------

def eval_prompts() -> list[dict]:
    """The held-out prompts: written once from the installed packages, then read back."""
    path = OUT / "eval_prompts.json"
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))["prompts"]
    tokenizer = load_tokenizer()
    site = Path(importlib.util.find_spec("click").origin).parents[1]
    prompts = []
    for source in EVAL_PROMPT_SOURCES:
        text = (site / source).read_text(encoding="utf-8")
        ids = tokenizer.encode(text, add_special_tokens=False).ids[:PROMPT_TOKENS]
        prompts.append({"source": source, "ids": ids, "text": tokenizer.decode(ids)})
    _write_json(path, {"about": "opening tokens of non-stdlib modules, held out from training",
                       "prompts": prompts})
    return prompts


@torch.inference_mode()
def target_greedy(target, ids: list[int], new_tokens: int) -> tuple[list[int], float]:
    """Plain greedy decoding (float32, KV cache); also the smallest top-1/top-2 logit margin."""
    out = target.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False,
                          output_scores=True, return_dict_in_generate=True,
                          eos_token_id=EOS_TOKEN_ID, pad_token_id=EOS_TOKEN_ID)
    margins = [float(s[0].topk(2).values.diff().abs()) for s in out.scores]
    return out.sequences[0, len(ids):].tolist(), min(margins)


def stage_greedy() -> None:
    """Record the held-out prompts whose greedy paths are least fragile: the GREEDY_PROMPTS with the
    widest smallest top-1/top-2 logit margin, so another BLAS cannot flip a near tie."""
    target = load_target()
    records = []
    for prompt in eval_prompts():
        tokens, margin = target_greedy(target, prompt["ids"], GREEDY_NEW_TOKENS)
        records.append({"source": prompt["source"], "prompt_ids": prompt["ids"],
                        "prompt_text": prompt["text"], "greedy_ids": tokens,
                        "min_logit_margin": round(margin, 4)})
        log(f"greedy: {prompt['source']}: {len(tokens)} tokens, min top-2 margin {margin:.3f}")
    records = sorted(records, key=lambda r: -r["min_logit_margin"])[:GREEDY_PROMPTS]
    _write_json(OUT / "greedy.json", {
        "about": "the committed target's greedy tokens (transformers, float32, KV cache) for the "
                 "held-out prompts with the widest top-1/top-2 logit margins",
        "new_tokens": GREEDY_NEW_TOKENS, "records": records,
    })


@torch.inference_mode()
def measure_tau(drafter, target, prompts, new_tokens=EVAL_NEW_TOKENS) -> dict:
    from dflash_gguf.validation.reference import speculative_runs

    runs = speculative_runs(drafter, target, [p["ids"] for p in prompts], new_tokens, [EOS_TOKEN_ID])
    per_prompt, lengths, mismatches = [], [], 0
    for prompt, run in zip(prompts, runs):
        reference, _ = target_greedy(target, prompt["ids"], new_tokens)
        mismatches += run.tokens != reference[: len(run.tokens)]
        lengths += run.acceptance_lengths
        per_prompt.append(round(run.tau, 3))
    return {"tau": sum(lengths) / len(lengths), "per_prompt": per_prompt, "steps": len(lengths),
            "tokens": sum(lengths), "not_lossless": mismatches}


@torch.inference_mode()
def time_forwards(drafter, target, block: int, repeats: int = 20) -> dict:
    """Milliseconds of one decoding step's two halves, after a 128-token prefix, as in
    `dflash_generate`: the target verifying `block` tokens (KV cache), and the drafter drafting a
    block from the features of the `block` tokens accepted last (its own KV cache holds the rest)."""
    from dflash.model import _crop_to, _make_cache, extract_context_feature

    ctx = 128
    ids = torch.randint(0, BPE_SIZE, (1, ctx + block))
    cache = _make_cache(target.config)
    out = target(ids[:, :ctx], past_key_values=cache, use_cache=True, output_hidden_states=True)
    feats = extract_context_feature(out.hidden_states, TARGET_LAYER_IDS)
    noise = F.embedding(ids[:, ctx:ctx + block], target.get_input_embeddings().weight)
    draft_cache = _make_cache(drafter.config)
    drafter(target_hidden=feats[:, : ctx - block], noise_embedding=noise,
            position_ids=torch.arange(ctx)[None], past_key_values=draft_cache, use_cache=True)
    _crop_to(draft_cache, ctx - block)

    def target_step():
        target(ids[:, ctx:], past_key_values=cache, use_cache=True, output_hidden_states=True)
        _crop_to(cache, ctx)

    def draft_step():
        hidden = drafter(target_hidden=feats[:, ctx - block:], noise_embedding=noise,
                         position_ids=torch.arange(ctx - block, ctx + block)[None],
                         past_key_values=draft_cache, use_cache=True)
        _crop_to(draft_cache, ctx - block)
        if hasattr(drafter, "markov_head"):  # DSpark: anchor-first, every position drafts
            drafter.draft(hidden, ids[:, ctx], target.lm_head)
        elif hasattr(drafter, "propose"):
            drafter.propose(hidden[:, 1:], ids[:, ctx], target.lm_head, 0.0)
        else:
            drafter.compute_logits(hidden[:, 1:], target.lm_head).argmax(-1)

    result = {}
    for label, fn in (("target_verify_ms", target_step), ("draft_ms", draft_step)):
        fn()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        result[label] = round((time.perf_counter() - start) / repeats * 1000, 2)
    return result


def stage_eval(only: str | None = None) -> dict:
    target = load_target()
    prompts = eval_prompts()
    results = {}
    for name in DRAFTERS if only is None else (only,):
        if not (OUT / name / "model.safetensors").exists():
            continue
        drafter = load_drafter(name)
        started = time.time()
        results[name] = measure_tau(drafter, target, prompts)
        results[name]["eval_s"] = round(time.time() - started, 1)
        results[name].update(time_forwards(drafter, target, DRAFTERS[name]["block_size"]))
        log(f"eval {name}: {json.dumps(results[name])}")
    write_reference_tau(results)
    return results


def write_reference_tau(results: dict) -> None:
    """What the reference reached, for comparing llama.cpp's acceptance with it (timings left out:
    they depend on the machine's load). Drafters not evaluated this time keep their entries."""
    keep = ("tau", "per_prompt", "steps", "tokens", "not_lossless")
    path = OUT / "reference_tau.json"
    drafters = json.loads(path.read_text(encoding="utf-8"))["drafters"] if path.exists() else {}
    drafters.update({name: {key: r[key] for key in keep} for name, r in results.items()})
    _write_json(path, {
        "about": "reference dflash_generate (DSpark: dflash_gguf.validation.dspark_reference.dspark_generate), "
                 "temperature 0, target float32, stop at <|endoftext|>, on eval_prompts.json; "
                 "tau = tokens per target verification incl. the bonus token",
        "new_tokens": EVAL_NEW_TOKENS,
        "drafters": drafters,
    })


# --- command line --------------------------------------------------------------------------

STAGES = ("tokenizer", "target", "distill", *DRAFTERS, "greedy", "eval")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", choices=("all", *STAGES), default="all")
    parser.add_argument("--steps", type=int, default=None, help="override the stage's step count")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drafter", choices=DRAFTERS, default=None,
                        help="eval: only this drafter (its entry of reference_tau.json is rewritten)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    stages = STAGES if args.stage == "all" else (args.stage,)
    for stage in stages:
        started = time.time()
        log(f"== stage {stage}")
        if stage == "tokenizer":
            stage_tokenizer()
        elif stage == "target":
            stage_target(args.steps or TARGET_STEPS)
        elif stage == "distill":
            stage_distill()
        elif stage in DRAFTERS:
            stage_drafter(stage, args.steps)
        elif stage == "greedy":
            stage_greedy()
        elif stage == "eval":
            stage_eval(args.drafter)
        log(f"== stage {stage} done in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
