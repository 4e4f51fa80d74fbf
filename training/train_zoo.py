"""Train the zoo's drafters with `dflash-gguf train`: a DFlash and a DFlash 2 drafter for each target
family's toy (training/fixtures/families.py), committed under tests/fixtures/zoo/<arch>/<variant>/.

    python -m training.train_zoo                    # every family and variant missing or stale (resumable)
    python -m training.train_zoo qwen35 gemma4      # these families only
    python -m training.train_zoo --force llama      # retrain even if current
    python -m training.train_zoo --force --steps 3000 --variants dflash qwen35moe   # longer, one variant
    python -m training.train_zoo --table            # the committed drafters' figures, as markdown
    python -m training.train_zoo --force --prompts 800 --variants dflash lfm2   # more answers to learn from
    python -m training.train_zoo --force --threads 2 qwen35moe   # both cores for one drafter (the teacher and torch)
    python -m training.train_zoo --force --lr 3e-3 qwen35moe      # another peak learning rate (train --lr)

Each drafter starts from the family's published geometry (training/fixtures/family_drafters.py: its
target layers, block size, sliding window, DFlash 2 shapes at toy width; `train --init`) and learns
from the F16 target's own greedy answers, computed by the patched llama.cpp, to 200 chat prompts
(training/smollm2_prompts.py, seed 7), 20 of them held out (`--prompts N`: N of the same generator,
the same 20 held out); `train` measures held-out tau with
`validate` at the end and writes it to the card. `trained.json` beside the checkpoint records the
target file it was trained for (sha256): the fixture uses the trained drafter only for that target,
and tests/house/test_families.py fails when a fixture change leaves a drafter stale.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dflash_gguf.train.settings import VARIANTS as RECIPE
from dflash_gguf.hashing import sha256_file
from training.fixtures import families as zoo
from training.fixtures.family_drafters import VARIANTS, write_drafter
from training.fixtures.toys import FAMILIES
from training.smollm2_prompts import build_prompts

PROMPTS, SEED = 200, 7
STEPS = 1000  # about 2 minutes of training a drafter on one thread of a 2-core machine
ANSWER_TOKENS = 64


def prompts_files(folder: Path, count: int = PROMPTS) -> tuple[Path, Path]:
    """(training, held out): the held-out prompts are always the 20 that `train` holds out of the first
    PROMPTS (so every drafter of the table is measured on the same ones); training takes `count` prompts
    of the same generator without them."""
    from dflash_gguf.runner.prompts import read_prompts
    from dflash_gguf.train.pipeline import TrainOptions, split_prompts

    def write(name: str, conversations: list[dict]) -> Path:
        path = folder / name
        path.write_text("".join(json.dumps(c) + "\n" for c in conversations), encoding="utf-8")
        return path

    base = build_prompts(PROMPTS, SEED, [])
    _, held = split_prompts(read_prompts(write("zoo-base.jsonl", base)), TrainOptions(), folder)
    held_texts = {str(p) for p in held}
    held_rows = [c for c, p in zip(base, read_prompts(folder / "zoo-base.jsonl")) if str(p) in held_texts]
    rows = [c for c in build_prompts(count, SEED, []) if c not in held_rows]
    return write("zoo-prompts.jsonl", rows), write("zoo-held-out.jsonl", held_rows)


def current(arch: str, variant: str, target: Path) -> bool:
    record = zoo.trained_record(arch, variant)
    return record is not None and record["target_sha256"] == sha256_file(target)


def train_one(arch: str, variant: str, family: Path, prompts: tuple[Path, Path], steps: int = STEPS,
              threads: int = 1, lr: float | None = None) -> dict:
    fam = FAMILIES[arch]
    out = zoo.ZOO / arch / variant
    target = family / "target-F16.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)  # an earlier drafter and its trained.json: train writes it anew
    with tempfile.TemporaryDirectory() as tmp:
        init = Path(tmp) / "init"
        write_drafter(fam, variant, family / "hf", init, zoo.VOCABULARIES[fam.tokenizer].mask)
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "dflash_gguf.cli", "train", "-t", str(target), "--prompts", str(prompts[0]),
             "--eval-prompts", str(prompts[1]), "--init", str(init), "-o", str(out), "--steps", str(steps),
             "--answer-tokens", str(ANSWER_TOKENS), "--threads", str(threads), "--force", "--json",
             *(["--lr", str(lr)] if lr else [])],
            capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"train_zoo: {arch} {variant}: {proc.stderr.strip().splitlines()[-1]}")
    summary = json.loads(proc.stdout)
    record = {"arch": arch, "variant": variant, "target_sha256": sha256_file(target), "steps": summary["steps"],
              "prompts": summary["prompts_trained"], "threads": threads, "lr": summary["lr"],
              "teacher_seconds": summary["teacher_seconds"], "train_seconds": summary["train_seconds"],
              "wall_seconds": round(time.monotonic() - started, 1), "held_out": summary["held_out"]}
    (out / zoo.TRAINED).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def table() -> str:
    """docs/train.md's zoo table, from the committed trained.json records."""
    header = ("family", "variant", "prompts", "steps", "threads", "peak lr", "teacher", "training", "held-out tau",
              "acceptance", "lossless")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for arch in FAMILIES:
        for variant in VARIANTS:
            rec = zoo.trained_record(arch, variant)
            if rec is None:
                continue
            held = rec["held_out"]
            cells = (arch, variant, rec.get("prompts", PROMPTS - 20), rec["steps"], rec.get("threads", 1),
                     f"{rec.get('lr', RECIPE[variant]['lr']):g}",  # records before `lr`: train's default
                     f"{rec['teacher_seconds']:.0f} s", f"{rec['train_seconds']:.0f} s", f"{held['tau']:.2f}",
                     f"{held['acceptance_rate']:.3f}", "yes" if held["lossless"] else "no")
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("archs", nargs="*", help="families (default: every one whose target converts)")
    parser.add_argument("--force", action="store_true", help="retrain drafters that are current")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"training steps a drafter (default {STEPS})")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated (default: both)")
    parser.add_argument("--prompts", type=int, default=PROMPTS,
                        help=f"training prompts of the generator (default {PROMPTS}, {PROMPTS - 20} after the held-out "
                             "20; more: more of the teacher's time, more answers to learn from)")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads of the teacher and of torch (default 1: two families can train side by side)")
    parser.add_argument("--lr", type=float, help="peak learning rate (train --lr; default: train's)")
    parser.add_argument("--table", action="store_true", help="print the committed drafters' figures and stop")
    args = parser.parse_args(argv)
    if args.table:
        print(table())
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        prompts = prompts_files(Path(tmp), args.prompts)
        for arch in args.archs or list(FAMILIES):
            family = zoo.family_folder(arch)
            if not (family / "target-F16.gguf").is_file():
                print(f"{arch:13} no F16 target: {json.loads((family / zoo.STATUS).read_text()).get('F16')}")
                continue
            for variant in args.variants.split(","):
                if not args.force and current(arch, variant, family / "target-F16.gguf"):
                    print(f"{arch:13} {variant:8} current")
                    continue
                record = train_one(arch, variant, family, prompts, args.steps, args.threads, args.lr)
                held = record["held_out"]
                print(f"{arch:13} {variant:8} tau {held['tau']:.2f}, acceptance {held['acceptance_rate']:.2f}, "
                      f"lossless {held['lossless']}, {record['wall_seconds']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
