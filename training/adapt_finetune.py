"""A published drafter adapted to a fine-tune by `dflash-gguf train --init`: the committed SmolLM2
drafters (tests/fixtures/smollm2/) on the pirate fine-tune (training/fixtures/smollm2_finetune.py,
build/fixtures/smollm2/finetune-Q4_K_M.gguf), before and after.

    python -m training.adapt_finetune [--variants dflash2] [--minutes 20 | --steps N] [--prompts 400]

Before: `dflash-gguf validate` of the committed drafter on the fine-tune (greedy, 64 new tokens, one
thread) on the project's held-out prompts, and, for comparison, on the original target. After:
`dflash-gguf train --init <the committed drafter>` with the fine-tune as the teacher, on the first
`--prompts` of training/train_smollm2.py's generator (its first 1,500, as the runs of docs/train.md), for `--minutes` (or exactly `--steps`), one thread; then
the same measurement. Outputs under build/adapt-finetune/: the adapted drafters, the train logs and
results.json, printed as a table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from training.fixtures import smollm2 as fixture
from training.smollm2_vs_recipe import CLI, REPO, log, measure
from training.train_smollm2 import prompts_file

OUT = REPO / "build" / "adapt-finetune"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=["dflash2"], choices=["dflash", "dflash2"])
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--minutes", type=float, default=20.0)
    budget.add_argument("--steps", type=int)
    parser.add_argument("--prompts", type=int, default=400, help="training prompts (the generator's first N)")
    parser.add_argument("--answer-tokens", type=int, default=128)
    args = parser.parse_args(argv)

    OUT.mkdir(parents=True, exist_ok=True)
    original = fixture.smollm2_ggufs()["Q4_K_M"]
    tuned = fixture.finetune_ggufs()["Q4_K_M"]
    lines = prompts_file(1500).read_text(encoding="utf-8").splitlines()[: args.prompts]
    prompts = OUT / f"prompts-{len(lines)}.jsonl"
    prompts.write_text("\n".join(lines) + "\n", encoding="utf-8")
    budget_args = ["--steps", str(args.steps)] if args.steps else ["--minutes", str(args.minutes)]
    rows = []
    for variant in args.variants:
        published = fixture.COMMITTED / variant
        for label, target in (("original target", original), ("fine-tune", tuned)):
            log(f"before: the committed {variant} on the {label}")
            rows.append({"drafter": f"committed {variant}", "target": label,
                         **measure(target, published, fixture.EVAL_PROMPTS)})
        out = OUT / f"{variant}-adapted"
        log(f"train --init {published} on the fine-tune ({' '.join(budget_args)}, one thread)")
        with open(OUT / f"{variant}-adapted.log", "w") as logfile:
            proc = subprocess.run([*CLI, "train", "-t", str(tuned), "--prompts", str(prompts), "--eval-prompts",
                                   str(fixture.EVAL_PROMPTS), "-o", str(out), "--init", str(published), *budget_args,
                                   "--answer-tokens", str(args.answer_tokens), "--threads", "1", "--force",
                                   "--json"], cwd=REPO, stdout=subprocess.PIPE, stderr=logfile, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"train --init failed: see {OUT / f'{variant}-adapted.log'}")
        summary = json.loads(proc.stdout)
        (OUT / f"{variant}-adapted.json").write_text(proc.stdout)
        rows.append({"drafter": f"adapted {variant} ({summary['steps']} steps, {summary['train_seconds']:.0f} s)",
                     "target": "fine-tune", **measure(tuned, out, fixture.EVAL_PROMPTS)})
    (OUT / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("| drafter | target | tau | acceptance | lossless |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['drafter']} | {r['target']} | {r['tau']:.2f} | {r['acceptance_rate']:.2f} | "
              f"{'yes' if r['lossless'] else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
