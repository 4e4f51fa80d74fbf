"""What deriving the HF target from the GGUF costs: the derived model (float32, transformers) against
llama.cpp's own targets, teacher-forced on the same tokens.

    python -m training.hf_fidelity [--prompts N] [--new-tokens N] [--json]

For each held-out prompt (tests/fixtures/smollm2/eval_prompts.jsonl, chat template), the HF model
decodes greedily; llama.cpp (the patched libllama, in-process) then evaluates the same prompt + answer
with each target GGUF. Reported per target: how many answer positions have the same argmax
(teacher-forced top-1 agreement), how many answers llama.cpp's greedy decoding would reproduce in
full (no position disagrees), and the logit differences (mean and max |HF - llama.cpp|).
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from training.fixtures import smollm2 as fixture
from training.train_smollm2 import EOS_TOKEN_ID, _read_jsonl, load_target, load_tokenizer, render

TARGETS = ("F16", "Q8_0", "Q4_1", "Q4_K_M")


@torch.inference_mode()
def hf_answers(prompts: list[list[int]], new_tokens: int) -> tuple[list[list[int]], list[np.ndarray]]:
    """The HF model's greedy answers and its logits at every answer position."""
    target = load_target(torch.float32)
    answers, logits = [], []
    for ids in prompts:
        out = target.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False,
                              eos_token_id=EOS_TOKEN_ID, pad_token_id=EOS_TOKEN_ID)
        answer = out[0, len(ids):].tolist()
        full = target(torch.tensor([ids + answer])).logits[0, len(ids) - 1: len(ids) - 1 + len(answer)]
        answers.append(answer)
        logits.append(full.float().numpy())
    return answers, logits


def compare(prompts, answers, hf_logits, paths: dict[str, object], threads: int = 1) -> dict:
    from dflash_gguf.validation.teacher_forcing import TeacherForcing

    report = {}
    n_ctx = max(len(p) + len(a) for p, a in zip(prompts, answers)) + 8
    for name, path in paths.items():
        agree = total = full = 0
        diffs, max_diff = [], 0.0
        with TeacherForcing(path, n_ctx, threads=threads) as engine:
            for ids, answer, ref in zip(prompts, answers, hf_logits):
                got = engine.logits(ids, answer)
                same = got.argmax(-1) == ref.argmax(-1)
                agree += int(same.sum())
                total += len(answer)
                full += int(same.all())
                delta = np.abs(got - ref)
                diffs.append(float(delta.mean()))
                max_diff = max(max_diff, float(delta.max()))
        report[name] = {"top1_agreement": round(agree / total, 4), "positions": total,
                        "answers_reproduced": f"{full}/{len(prompts)}",
                        "mean_abs_logit_diff": round(float(np.mean(diffs)), 4),
                        "max_abs_logit_diff": round(max_diff, 3)}
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--llama-bin", default=None, help="bin folder of the patched build (default: the cached one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer()
    prompts = [render(tokenizer, c["messages"]) for c in _read_jsonl(fixture.EVAL_PROMPTS)][: args.prompts]
    answers, logits = hf_answers(prompts, args.new_tokens)
    from pathlib import Path

    paths = fixture.cached_targets(Path(args.llama_bin) if args.llama_bin else None)
    report = compare(prompts, answers, logits, {t: paths[t] for t in TARGETS}, args.threads)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{len(prompts)} held-out prompts x {args.new_tokens} greedy tokens of the HF model (float32)")
        for name, r in report.items():
            print(f"  {name:7} top-1 agreement {r['top1_agreement']:.2%} of {r['positions']} positions, "
                  f"answers reproduced {r['answers_reproduced']}, |logit diff| mean "
                  f"{r['mean_abs_logit_diff']:.3f} max {r['max_abs_logit_diff']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
