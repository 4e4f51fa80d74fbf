"""SmolLM2-135M-Instruct's drafter trained from its GGUF by `dflash-gguf train` (docs/train.md's runs).

    python -m training.smollm2_gguf -o DRAFTER_DIR [--variant dflash|dflash2] [--minutes 30] [--prompts 1500]
                                    [--target build/fixtures/smollm2/target-Q4_K_M.gguf] [-- TRAIN_ARGS...]

Writes the training prompts (training/smollm2_prompts.py: the same 1,500 conversations, seed and
held-out exclusions as `make train-smollm2`) to the cache as JSONL, then runs

    dflash-gguf train --target TARGET --prompts PROMPTS --eval-prompts tests/fixtures/smollm2/eval_prompts.jsonl
                      -o DRAFTER_DIR --variant V --minutes M

so the held-out tau is llama.cpp's on the same 24 prompts today's recipe (training/train_smollm2.py)
reports. Rerunning the same command resumes a killed run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from dflash_gguf.paths import cache_dir
from tests.fixtures import smollm2 as fixture
from training.smollm2_prompts import build_prompts

SEED = 20261201  # training/train_smollm2.py's


def prompts_file(count: int) -> Path:
    out = cache_dir() / "training-smollm2" / f"prompts-{count}.jsonl"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        held_out = [m["content"] for line in fixture.EVAL_PROMPTS.read_text().splitlines() if line.strip()
                    for m in json.loads(line)["messages"]]
        conversations = build_prompts(count, SEED, held_out)
        tmp = out.with_suffix(".partial")
        tmp.write_text("".join(json.dumps({"messages": c["messages"]}, ensure_ascii=False) + "\n"
                               for c in conversations), encoding="utf-8")
        tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--out", type=Path, required=True)
    parser.add_argument("--variant", choices=("dflash", "dflash2"), default="dflash")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--prompts", type=int, default=1500)
    parser.add_argument("--target", type=Path, default=fixture.OUT / "target-Q4_K_M.gguf")
    args = parser.parse_args(argv)
    command = [sys.executable, "-m", "dflash_gguf.cli", "train", "--target", str(args.target),
               "--prompts", str(prompts_file(args.prompts)), "--eval-prompts", str(fixture.EVAL_PROMPTS),
               "-o", str(args.out), "--variant", args.variant, "--minutes", str(args.minutes), *extra]
    print(" ".join(command), file=sys.stderr, flush=True)
    return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main())
