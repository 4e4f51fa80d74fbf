"""Train a DFlash (block 16) and a DFlash 2 (block 8) drafter for SmolLM2-135M-Instruct, offline, on CPU.

    python -m training.train_smollm2                  # every stage, in order (resumes where it stopped)
    python -m training.train_smollm2 --stage eval     # one stage (they read what earlier ones wrote)

Stages (training/README.md has the recipe, the data and the measured times):

    prompts    chat conversations built from what is installed here (training/smollm2_prompts.py),
               rendered with the target's chat template and tokenized
    distill    the target's own greedy answers (the HF target derived from the GGUF, bf16,
               batched, KV cache) with its hidden states at TARGET_LAYER_IDS for every token
    dflash     DFlashDraftModel trained by train/recipe.py (checkpointed every 50 steps)
    dflash2    DFlash2DraftModel, the same (every stage at once runs the two side by side, one
               process and one thread each)
    eval       tau of each drafter by the reference `dflash_generate`'s acceptance rule (greedy,
               64 new tokens) on tests/fixtures/smollm2/eval_prompts.jsonl -> reference_tau.json
               (--training-answers N: on N training answers instead, printed)

The target comes from tests/fixtures/smollm2.py (the wheel's GGUF, requantized; its HF form
derived by training/hf_from_gguf.py). Intermediate data lives in ~/.cache/dflash-gguf/training-
smollm2/; every stage skips work already on disk, so an interrupted run continues where it stopped.
The drafters land in tests/fixtures/smollm2/{dflash,dflash2}/ (config.json, bf16 safetensors,
model card).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from tests.fixtures import smollm2 as fixture
from dflash_gguf.train import recipe
from dflash_gguf.train.recipe import DistillSet, DrafterShape, log, write_json
from training.smollm2_prompts import build_prompts, prompt_counts

SEED = 20261201
OUT = fixture.COMMITTED

PROMPTS = 1500                # all the prompts stage made (in its seeded order)
PROMPT_POOL = 1500            # half code, half chat (training/smollm2_prompts.py)
MAX_PROMPT_TOKENS = 320       # longer rendered prompts are dropped
ANSWER_TOKENS = 128           # greedy tokens per answer (the evaluation drafts 64; the rest is more data)
TARGET_LAYER_IDS = (1, 14, 27)  # dflash.model.build_target_layer_ids(30, 3)
DISTILL_BATCH = 64
# the target's most likely next tokens kept per answer position: the drafters' loss reads the head
# only on those rows (plus sampled ones), not on all 49,152 (recipe.subset_logits)
TEACHER_TOP_K = 32
# SmolLM2's embedding has no spare row (49,152 tokens, all in use): the mask is <empty_output>, a
# special token of its pretraining format that chat never produces.
MASK_TOKEN_ID = 16
EOS_TOKEN_ID = 2                # <|im_end|>, the end of an assistant turn
EVAL_NEW_TOKENS = 64

# Both drafters start from the target's layers 28-29 (recipe.init_from_target) and learn from the
# target's top-k next tokens (soft_labels: their weight against the greedy token) and its final
# hidden state (feature_loss), besides the recipe's greedy-token loss; the softmax runs over those
# tokens and `sampled_softmax` random others, not the whole vocabulary (recipe.subset_logits: a
# DFlash step 4.4x faster, the same held-out tau at equal steps); see training/README.md.
DRAFTERS = {
    "dflash": {
        "architecture": "DFlashDraftModel", "num_layers": 2, "block_size": 16,
        "steps": 7000, "seqs_per_step": 8, "anchors_per_seq": 8, "lr": 1.5e-3, "gamma": 7.0,
        "soft_labels": 0.5, "feature_loss": 1.0, "sampled_softmax": 1024,
    },
    "dflash2": {
        "architecture": "DFlash2DraftModel", "num_layers": 2, "block_size": 8,
        "steps": 8000, "seqs_per_step": 4, "anchors_per_seq": 8, "lr": 1.5e-3, "gamma": 4.0,
        "soft_labels": 0.5, "feature_loss": 1.0, "sampled_softmax": 1024,
        # llama.cpp: n_embd % conv_group_size == 0 and n_embd >= top_k * (top_k + 1); rank 16
        # keeps the codebooks (2 x 49,152 x rank) inside the 40 MB the two drafters may commit
        "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 16, "selector_top_k": 8,
    },
}
STAGES = ("prompts", "distill", *DRAFTERS, "eval")


def work_dir() -> Path:
    from dflash_gguf.paths import cache_dir

    folder = cache_dir() / "training-smollm2"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(fixture.hf_target())


def render(tokenizer, messages: list[dict]) -> list[int]:
    """The conversation as the target sees it: its chat template, the assistant turn opened."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def rope_theta(config) -> float:
    """transformers 5 keeps it in rope_parameters, 4.x as an attribute."""
    parameters = getattr(config, "rope_parameters", None) or {}
    return parameters.get("rope_theta") or config.rope_theta


def shape(config) -> DrafterShape:
    return DrafterShape(
        hidden=config.hidden_size, n_head=config.num_attention_heads,
        n_head_kv=config.num_key_value_heads, head_dim=config.head_dim, ffn=config.intermediate_size,
        vocab=config.vocab_size, rope_theta=float(rope_theta(config)), rms_eps=config.rms_norm_eps,
        max_positions=config.max_position_embeddings, num_target_layers=config.num_hidden_layers,
        target_layer_ids=TARGET_LAYER_IDS, mask_token_id=MASK_TOKEN_ID, eos_token_id=EOS_TOKEN_ID)


def load_target(dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(fixture.hf_target(), dtype=dtype)
    return target.eval().requires_grad_(False)


# --- stage: prompts ------------------------------------------------------------------------

def prompt_records(count: int) -> list[dict]:
    """`count` training conversations of the recipe's generator (its seed, the held-out prompts and
    their subjects left out, rendered prompts of at most MAX_PROMPT_TOKENS), with their token ids."""
    tokenizer = load_tokenizer()
    held_out = [m["content"] for c in _read_jsonl(fixture.EVAL_PROMPTS) for m in c["messages"]]
    log(f"prompts: pools {json.dumps(prompt_counts())}")
    records = []
    for conversation in build_prompts(int(count * 1.1), SEED, held_out):
        ids = render(tokenizer, conversation["messages"])
        if len(ids) <= MAX_PROMPT_TOKENS:
            records.append({**conversation, "ids": ids})
    return records[:count]


def stage_prompts(count: int = PROMPT_POOL) -> None:
    out = work_dir() / "prompts.jsonl"
    if out.is_file():
        log(f"prompts: {out} exists")
        return
    records = prompt_records(count)
    tmp = out.with_suffix(".partial")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    tmp.replace(out)
    log(f"prompts: {len(records)} conversations, "
        f"{sum(len(r['ids']) for r in records) / len(records):.0f} tokens on average")


# --- stage: distill ------------------------------------------------------------------------

@torch.inference_mode()
def greedy_with_features(target, prompts: list[list[int]], new_tokens: int):
    """Batched greedy answers (left-padded, KV cache, stop at <|im_end|>), the tapped hidden
    states of every token fed to the target and its final (normed) hidden state, from which the
    head gives the target's distribution over the next token: (prompt + answer ids, [len - 1,
    n_feat] features, [len - 1, hidden] final states) per prompt. The last answer token is never
    fed, so it has neither (it is only ever a label)."""
    from dflash.model import extract_context_feature
    from transformers import DynamicCache

    rows, longest = len(prompts), max(map(len, prompts))
    batch = torch.full((rows, longest), EOS_TOKEN_ID, dtype=torch.long)
    mask = torch.zeros((rows, longest), dtype=torch.long)
    for r, ids in enumerate(prompts):
        batch[r, longest - len(ids):] = torch.tensor(ids)
        mask[r, longest - len(ids):] = 1
    position = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=target.config)
    out = target(batch, attention_mask=mask, position_ids=position, past_key_values=cache,
                 use_cache=True, output_hidden_states=True, logits_to_keep=1)
    feats = [extract_context_feature(out.hidden_states, list(TARGET_LAYER_IDS)).half()]
    finals = [out.hidden_states[-1].half()]  # transformers' last entry is after the final norm
    token = out.logits[:, -1].argmax(-1)
    answers, finished = [token], token == EOS_TOKEN_ID
    position = position[:, -1:]
    for _ in range(new_tokens - 1):
        if bool(finished.all()):
            break
        mask = torch.cat([mask, torch.ones((rows, 1), dtype=torch.long)], 1)
        position = position + 1
        out = target(token[:, None], attention_mask=mask, position_ids=position, past_key_values=cache,
                     use_cache=True, output_hidden_states=True)
        feats.append(extract_context_feature(out.hidden_states, list(TARGET_LAYER_IDS)).half())
        finals.append(out.hidden_states[-1].half())
        token = out.logits[:, -1].argmax(-1)
        answers.append(token)
        finished |= token == EOS_TOKEN_ID
    answers = torch.stack(answers, 1)
    feats, finals = torch.cat(feats, 1), torch.cat(finals, 1)
    results = []
    for r, ids in enumerate(prompts):
        answer = answers[r].tolist()
        if EOS_TOKEN_ID in answer:
            answer = answer[: answer.index(EOS_TOKEN_ID) + 1]
        start = longest - len(ids)
        fed = slice(start, start + len(ids) + len(answer) - 1)
        results.append((ids + answer, feats[r, fed].clone(), finals[r, fed].clone()))
    return results


def _claim(part: Path) -> bool:
    """Take a batch for this process: False when another live worker has it (or it is done)."""
    claim = part.with_suffix(".claim")
    for _ in range(2):
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                os.kill(int(claim.read_text() or 0), 0)
                return False
            except (ProcessLookupError, ValueError):
                claim.unlink(missing_ok=True)  # its worker is gone: take it over
                continue
            except PermissionError:
                return False
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return not part.is_file()
    return False


def stage_distill(batch_size: int = DISTILL_BATCH) -> None:
    """The target's greedy answers with their features, in batches of similar prompt length.
    Each finished batch is saved, so a rerun continues after the last one; several processes may
    run this stage at once (each claims a batch), and the one that finishes the last batch merges."""
    out = features_path()
    if out.is_file():
        log(f"distill: {out} exists")
        return
    prompts = [r["ids"] for r in _read_jsonl(work_dir() / "prompts.jsonl")][:PROMPTS]
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    parts = work_dir() / f"distill-{len(prompts)}x{ANSWER_TOKENS}"
    parts.mkdir(exist_ok=True)
    target = load_target(torch.bfloat16)
    started, made = time.time(), 0
    batches = [order[n:n + batch_size] for n in range(0, len(order), batch_size)]
    for b, rows in enumerate(batches):
        part = parts / f"{b:04d}.pt"
        if part.is_file() or not _claim(part):
            continue
        results = greedy_with_features(target, [prompts[i] for i in rows], ANSWER_TOKENS)
        tmp = part.with_suffix(f".{os.getpid()}.partial")
        torch.save({"rows": rows, "results": results}, tmp)
        tmp.replace(part)
        part.with_suffix(".claim").unlink(missing_ok=True)
        made += sum(len(ids) for ids, _, _ in results)
        done = sum((parts / f"{i:04d}.pt").is_file() for i in range(len(batches)))
        log(f"distill: batch {b + 1} done, {done}/{len(batches)} on disk ({time.time() - started:.0f} s, "
            f"{made / (time.time() - started):.0f} tok/s in this process)")
    if not all((parts / f"{i:04d}.pt").is_file() for i in range(len(batches))):
        log("distill: other workers are still on their batches; the last one merges")
        return
    sequences, prompt_lengths = [], []
    for b in range(len(batches)):
        saved = torch.load(parts / f"{b:04d}.pt")
        for i, result in zip(saved["rows"], saved["results"]):
            sequences.append(result)
            prompt_lengths.append(len(prompts[i]))
    width = max(len(ids) for ids, _, _ in sequences)
    n_feat, hidden = sequences[0][1].shape[-1], sequences[0][2].shape[-1]
    ids = torch.full((len(sequences), width), EOS_TOKEN_ID, dtype=torch.int32)
    feats = torch.zeros((len(sequences), width, n_feat), dtype=torch.float16)
    finals = torch.zeros((len(sequences), width, hidden), dtype=torch.float16)
    for i, (seq_ids, seq_feats, seq_finals) in enumerate(sequences):
        ids[i, : len(seq_ids)] = torch.tensor(seq_ids, dtype=torch.int32)
        feats[i, : len(seq_feats)] = seq_feats
        finals[i, : len(seq_finals)] = seq_finals
    lengths = torch.tensor([len(s) for s, _, _ in sequences])
    prompt_lengths = torch.tensor(prompt_lengths)
    ended = sum(int(s[-1] == EOS_TOKEN_ID) for s, _, _ in sequences)
    log(f"distill: the target's top-{TEACHER_TOP_K} at every answer position")
    teacher_ids, teacher_logp = recipe.teacher_top_k(finals, target.lm_head, prompt_lengths - 1,
                                                     lengths - 1, TEACHER_TOP_K)
    tmp = out.with_suffix(f".{os.getpid()}.partial")
    torch.save({"ids": ids, "feats": feats, "finals": finals, "lengths": lengths,
                "prompt_lengths": prompt_lengths, "target_layer_ids": list(TARGET_LAYER_IDS),
                "teacher_ids": teacher_ids, "teacher_logp": teacher_logp}, tmp)
    tmp.replace(out)
    log(f"distill: {len(sequences)} answers, {int((lengths - prompt_lengths).sum())} answer tokens "
        f"({ended} end with <|im_end|>) in {time.time() - started:.0f} s")


def features_path() -> Path:
    """The merged distillation set, named by what shapes it (a cache of another recipe is not read)."""
    return work_dir() / f"features-{PROMPTS}x{ANSWER_TOKENS}-top{TEACHER_TOP_K}.pt"


def load_features() -> DistillSet:
    data = torch.load(features_path())
    if data["target_layer_ids"] != list(TARGET_LAYER_IDS):
        raise RuntimeError("features.pt was made with other target layers: delete it and rerun --stage distill")
    return DistillSet(ids=data["ids"].long(), feats=data["feats"], valid_end=data["lengths"],
                      first_anchor=data["prompt_lengths"] - 1, mask_token_id=MASK_TOKEN_ID,
                      finals=data["finals"], teacher_ids=data["teacher_ids"], teacher_logp=data["teacher_logp"])


# --- stages: dflash, dflash2 ---------------------------------------------------------------

def model_card(name: str, spec: dict, trained_steps: int) -> str:
    variant = {"DFlashDraftModel": "DFlash", "DFlash2DraftModel": "DFlash 2"}[spec["architecture"]]
    return f"""---
license: apache-2.0
base_model: {fixture.BASE_MODEL}
tags:
- dflash
- speculative-decoding
- drafter
---

# {variant} drafter for SmolLM2-135M-Instruct (block {spec['block_size']})

A {spec['num_layers']}-layer {variant} drafter for `{fixture.BASE_MODEL}`, trained by dflash-gguf's
`make train-smollm2` (`training/train_smollm2.py`, recipe and data in `training/README.md`) on CPU,
on the target's own greedy answers to chat prompts built offline (beginners' Python questions and
tasks, code requests from the CPython standard library, explanations from its documentation,
everyday requests): {trained_steps} steps of {spec['seqs_per_step'] * spec['anchors_per_seq']} blocks, from copies of the target's layers
{TARGET_LAYER_IDS[-1] + 1}-{TARGET_LAYER_IDS[-1] + spec['num_layers']}, towards the target's greedy token, its {TEACHER_TOP_K} most likely next tokens and its
final hidden state. It reads the target's hidden states at layers
{list(TARGET_LAYER_IDS)} and borrows its embeddings and output head.
Mask token: id {MASK_TOKEN_ID} (`<empty_output>`).

A test fixture of the dflash-gguf project: its acceptance is in `reference_tau.json` beside it.
License: Apache-2.0, as the target.
"""


def stage_drafter(name: str, steps: int | None = None, minutes: float | None = None) -> None:
    spec = DRAFTERS[name]
    target = load_target(torch.bfloat16)  # frozen: bf16 as autocast would cast it, once
    config = recipe.drafter_config_dict(spec, shape(target.config))
    index = list(DRAFTERS).index(name)
    drafter = recipe.new_drafter(config, SEED + 10 + index)
    data = load_features()
    recipe.init_from_target(drafter, target, data.feats[:64, :64])
    drafter = recipe.train_drafter(
        drafter, target, data, spec,
        steps or spec["steps"], SEED + 20 + index, name,
        checkpoint=work_dir() / f"{name}.ckpt", bf16=True,
        deadline=time.time() + minutes * 60 if minutes else None)
    recipe.save_drafter(drafter, OUT / name, config)
    (OUT / name / "README.md").write_text(model_card(name, spec, drafter.trained_steps), encoding="utf-8")


# --- stage: eval ---------------------------------------------------------------------------

def eval_prompt_ids() -> list[list[int]]:
    tokenizer = load_tokenizer()
    return [render(tokenizer, c["messages"]) for c in _read_jsonl(fixture.EVAL_PROMPTS)]


@torch.inference_mode()
def stage_eval(only: str | None = None) -> dict:
    """tau on the held-out prompts: the target's greedy answers (bf16, batched, as `distill` makes
    them) and dflash_generate's acceptance rule replayed on them (recipe.replay_acceptance,
    drafter under bf16 autocast): on this shared machine the reference loop itself, one target
    verification per step, did not fit in the time left."""
    prompts = eval_prompt_ids()
    path = work_dir() / f"eval-greedy-{EVAL_NEW_TOKENS}.pt"  # answers, features, final states
    if path.is_file():
        greedy = torch.load(path)
    else:
        greedy = greedy_with_features(load_target(torch.bfloat16), prompts, EVAL_NEW_TOKENS)
        torch.save(greedy, path)
    target = load_target()
    results = {}
    for name in DRAFTERS if only is None else (only,):
        if not (OUT / name / "model.safetensors").is_file():
            continue
        drafter = recipe.load_drafter(OUT / name)
        started = time.time()
        runs = replayed(name, drafter, target,
                        [(full, feats, len(ids)) for ids, (full, feats, _) in zip(prompts, greedy)])
        lengths = [n for run in runs for n in run]
        results[name] = {
            "tau": round(sum(lengths) / len(lengths), 4),
            "per_prompt": [round(sum(r) / len(r), 3) for r in runs],
            "steps": len(lengths), "tokens": sum(lengths), "acceptance_lengths": runs,
            "output_ids": [full[len(ids):len(ids) + sum(r) + 1] for ids, (full, _, _), r in zip(prompts, greedy, runs)],
        }
        log(f"eval {name}: tau {results[name]['tau']:.3f} per prompt {results[name]['per_prompt']} "
            f"({time.time() - started:.0f} s)")
    write_reference_tau(prompts, results)
    return results


def replayed(name: str, drafter, target, answers) -> list[list[int]]:
    """dflash_generate's acceptance lengths for each (prompt + answer ids, features, prompt length),
    the drafter under bf16 autocast, EVAL_NEW_TOKENS drafted, stop at <|im_end|>."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return [recipe.replay_acceptance(drafter, target, ids, feats.float(), prompt_len, EVAL_NEW_TOKENS,
                                         DRAFTERS[name], MASK_TOKEN_ID, [EOS_TOKEN_ID])
                for ids, feats, prompt_len in answers]


@torch.inference_mode()
def tau_on_training_answers(rows: int = 24) -> dict[str, float]:
    """The same replayed tau on `rows` seeded answers of the distillation set (their first
    EVAL_NEW_TOKENS tokens): against the held-out tau, how much of the drafters' acceptance is
    memorised. Printed, not written: reference_tau.json holds the held-out prompts only."""
    data = load_features()
    target = load_target()
    picked = torch.randperm(len(data.ids), generator=torch.Generator().manual_seed(0))[:rows].tolist()
    results = {}
    for name in DRAFTERS:
        answers = [(data.ids[r, :int(data.valid_end[r])].tolist(), data.feats[r, :int(data.valid_end[r]) - 1],
                    int(data.first_anchor[r]) + 1) for r in picked]
        lengths = [n for run in replayed(name, recipe.load_drafter(OUT / name), target, answers) for n in run]
        results[name] = round(sum(lengths) / len(lengths), 4)
        log(f"eval {name} on {rows} training answers: tau {results[name]:.3f}")
    return results


def write_reference_tau(prompts: list[list[int]], results: dict) -> None:
    """Add `results` to reference_tau.json, keeping the other drafters' entries (under a lock:
    `--stage eval --drafter NAME` may run once per drafter at the same time)."""
    import fcntl

    path = fixture.REFERENCE_TAU
    with open(work_dir() / "reference_tau.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        previous = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        drafters = previous.get("drafters", {}) if previous.get("prompt_ids") == prompts else {}
        write_json(path, {
            "about": "z-lab dflash==0.1.0's drafter classes with dflash_generate's greedy acceptance "
                     "rule replayed on the target's greedy answers (train/recipe.py "
                     "replay_acceptance; target = the HF folder derived from the shipped Q4_1 GGUF, "
                     "bf16; drafter under bf16 autocast), stop at <|im_end|>; prompts = "
                     "eval_prompts.jsonl rendered with the target's chat template (prompt_ids); "
                     "output_ids = the target's greedy answer; tau = tokens per target verification "
                     "incl. the bonus token",
            "new_tokens": EVAL_NEW_TOKENS, "stop_token_ids": [EOS_TOKEN_ID], "prompt_ids": prompts,
            "drafters": {**drafters, **results},
        })


# --- command line --------------------------------------------------------------------------

def run_stage(stage: str, args) -> None:
    started = time.time()
    log(f"== stage {stage}")
    if stage == "prompts":
        stage_prompts()
    elif stage == "distill":
        stage_distill()
    elif stage in DRAFTERS:
        stage_drafter(stage, args.steps, args.minutes)
    elif stage == "eval" and args.training_answers:
        tau_on_training_answers(args.training_answers)
    elif stage == "eval":
        stage_eval(args.drafter)
    log(f"== stage {stage} done in {time.time() - started:.0f} s")


def train_drafters_side_by_side(args) -> None:
    """Both drafter stages at once, one process and one thread each (how the committed drafters were
    trained: a drafter step is too small to keep two threads busy, two processes are not)."""
    import subprocess

    extra = [*(["--steps", str(args.steps)] if args.steps else []),
             *(["--minutes", str(args.minutes)] if args.minutes else [])]
    workers = {name: subprocess.Popen([sys.executable, "-m", "training.train_smollm2", "--stage", name,
                                       "--threads", "1", *extra]) for name in DRAFTERS}
    failed = [name for name, worker in workers.items() if worker.wait() != 0]
    if failed:
        raise SystemExit(f"train-smollm2: stage {', '.join(failed)} failed (rerun: it resumes from its checkpoint)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", choices=("all", *STAGES), default="all")
    parser.add_argument("--steps", type=int, default=None, help="override a drafter stage's step count")
    # on a shared machine a second OpenMP thread spins at every barrier (measured: batched decoding
    # 7x slower with 2 threads than with 1 when other work runs); `all` trains the two drafters
    # side by side, one thread each, whatever this says
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1),
                        help="torch threads for the stage (default: up to 2)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="a drafter stage stops after this long (checkpointed; the card says how many steps)")
    parser.add_argument("--drafter", choices=DRAFTERS, default=None, help="eval: only this drafter")
    parser.add_argument("--training-answers", type=int, default=0, metavar="N",
                        help="eval: tau on N seeded training answers instead (printed; what is memorised)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.stage != "all":
        run_stage(args.stage, args)
        return 0
    run_stage("prompts", args)
    run_stage("distill", args)
    started = time.time()
    train_drafters_side_by_side(args)
    log(f"== drafters done in {time.time() - started:.0f} s")
    run_stage("eval", args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
