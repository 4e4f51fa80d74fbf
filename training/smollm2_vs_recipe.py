"""SmolLM2-135M-Instruct Q4_K_M drafters trained from scratch by `dflash-gguf train`, measured beside
the committed drafters (tests/fixtures/smollm2/, `make train-smollm2`; until 2026-12-03 those were the
HF-teacher recipe's, whose figures docs/train.md keeps).

    python -m training.smollm2_vs_recipe --minutes 90 [--variants dflash dflash2] [--answer-tokens 128]
                                         [--prompts N] [--public N] [--tag NAME] [--threads N] [--measure-only]

The teacher is the Q4_K_M GGUF (llama.cpp, 2 threads) on the first 1,500 prompts of the generator
training/train_smollm2.py uses (its seed); the store is shared by the variants. Then each variant trains in its
own process, one thread each, side by side (2 cores: one each; a variant trained alone gets both,
`--threads` says otherwise), for `--minutes`; `--prompts N` takes N
prompts instead (more answers, more of the teacher's time); `train` itself
measures held-out tau on the project's held-out prompts (tests/fixtures/smollm2/eval_prompts.jsonl).
`--public N`: N of the prompts are ShareGPT first turns instead (training/public_prompts.py's
`--train` draw: other conversations than the 24 held out, so that held-out set is then the same
source's, not another's).
Last, every drafter, the committed ones included, is measured by `dflash-gguf validate` (greedy, 64 new
tokens, one thread) on three held-out sets: the project's, 24 first turns of ShareGPT conversations and
24 of WritingBench's writing requests (training/public_prompts.py), the last two by people who never
saw the training prompts (and WritingBench a source none of the training prompts come from).

Outputs: build/smollm2-vs-recipe/<variant>-<minutes>min/ (the drafters, their train logs) and
results-<minutes>min.json (one row per drafter and held-out set), printed as a table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from training.fixtures import smollm2 as fixture
from training import train_smollm2

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "build" / "smollm2-vs-recipe"
CLI = [sys.executable, "-m", "dflash_gguf.cli"]


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, file=sys.stderr, flush=True)


def public_prompts(source: str) -> Path:
    out = OUT / f"{source}-24.jsonl"
    if not out.is_file():
        subprocess.run([sys.executable, "-m", "training.public_prompts", "--source", source, "-o", str(out)],
                       check=True, cwd=REPO)
    return out


def training_prompts(count: int, public: int) -> Path:
    """The generator's first `count - public` conversations, then `public` ShareGPT first turns."""
    if not public:
        return train_smollm2.prompts_file(count)
    from training import public_prompts as sharegpt
    out = OUT / f"prompts-{count}-public{public}.jsonl"
    if not out.is_file():
        OUT.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".partial")
        sharegpt.write_prompts(tmp, sharegpt.training_turns(sharegpt.first_turns(), public))
        generated = train_smollm2.prompts_file(count - public).read_text(encoding="utf-8")
        tmp.write_text(generated + tmp.read_text(encoding="utf-8"), encoding="utf-8")
        tmp.replace(out)
    return out


def train_args(target: Path, prompts: Path, variant: str, budget: list[str], answer_tokens: int, out: Path,
               threads: int, extra: list[str]) -> list[str]:
    return [*CLI, "train", "-t", str(target), "--prompts", str(prompts), "--eval-prompts", str(fixture.EVAL_PROMPTS),
            "-o", str(out), "--variant", variant, *budget, "--answer-tokens", str(answer_tokens),
            "--threads", str(threads), "--json", *extra]


def measure(target: Path, drafter_dir: Path, prompts: Path) -> dict:
    """`validate` of the drafter (converted against the target) on `prompts`, greedy, 64 tokens."""
    with tempfile.TemporaryDirectory() as work:
        gguf = Path(work) / "drafter.gguf"
        subprocess.run([*CLI, "convert", str(drafter_dir), "--target", str(target), "-o", str(gguf)], check=True,
                       capture_output=True, cwd=REPO)
        proc = subprocess.run([*CLI, "validate", "-t", str(target), "--draft", str(gguf), "--prompts", str(prompts),
                               "-n", "64", "--threads", "1", "--json"], capture_output=True, text=True, cwd=REPO)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"validate {drafter_dir} failed:\n{proc.stderr[-2000:]}")
    report = json.loads(proc.stdout)
    return {"tau": report["mean_acceptance_length"], "acceptance_rate": report["acceptance_rate"],
            "lossless": report["lossless"], "prompts": len(report["prompts"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, required=True)
    parser.add_argument("--steps", type=int, help="train exactly this many steps (what --minutes sized on a quiet "
                        "machine, the train log says), so that other load does not shorten the run")
    parser.add_argument("--variants", nargs="+", default=["dflash", "dflash2"], choices=["dflash", "dflash2"])
    parser.add_argument("--answer-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=1500, help="train on this many prompts of the generator "
                        "(its seed and held-out exclusions; the committed drafters had 2,100): more of the "
                        "teacher's time, more answers")
    parser.add_argument("--public", type=int, default=0, help="of --prompts, this many are ShareGPT first turns "
                        "(never the held-out 24) instead of the generator's")
    parser.add_argument("--tag", help="name the runs and results by this instead of '<minutes>min'")
    parser.add_argument("--threads", type=int, help="training threads per variant (default: the machine's two "
                        "cores shared out: 1 each for two variants, 2 for one)")
    parser.add_argument("--compare", nargs="*", type=Path, default=[], metavar="DIR",
                        help="more drafters measured in the same run, e.g. the recipe's: `git archive 9e7a6c5 "
                        "tests/fixtures/smollm2 | tar -x -C DIR` (its last commit), then DIR/tests/fixtures/smollm2/dflash2")
    parser.add_argument("--measure-only", action="store_true", help="Measure drafters already trained.")
    args = parser.parse_args(argv)

    OUT.mkdir(parents=True, exist_ok=True)
    target = fixture.smollm2_ggufs()["Q4_K_M"]
    prompts = training_prompts(args.prompts, args.public)
    held_out = {"project's held-out": fixture.EVAL_PROMPTS, "ShareGPT": public_prompts("sharegpt"),
                "WritingBench": public_prompts("writingbench")}
    tag = args.tag or f"{args.minutes:g}min"
    runs = {v: OUT / f"{v}-{tag}" for v in args.variants}
    threads = args.threads or max(1, 2 // len(args.variants))
    if not args.measure_only:
        # the teacher once, on both cores (a store the variants share: same prompts, taps, answer length)
        log("teacher: the target's answers to the training prompts (2 threads)")
        subprocess.run(train_args(target, prompts, args.variants[0], ["--steps", "1"], args.answer_tokens,
                                  OUT / "teacher-probe", 2, ["--no-validate", "--force"]),
                       check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        procs = {}
        for variant, out in runs.items():
            log(f"{variant}: training for {args.minutes:g} minutes{f' ({args.steps} steps)' if args.steps else ''} "
                f"({threads} thread{'s' if threads > 1 else ''})")
            logfile = open(OUT / f"{variant}-{tag}.log", "w")
            budget = ["--steps", str(args.steps)] if args.steps else ["--minutes", str(args.minutes)]
            procs[variant] = (subprocess.Popen(train_args(target, prompts, variant, budget, args.answer_tokens,
                                                          out, threads, ["--force"]),
                                               cwd=REPO, stdout=subprocess.PIPE, stderr=logfile, text=True), logfile)
        for variant, (proc, logfile) in procs.items():
            stdout, _ = proc.communicate()
            logfile.close()
            if proc.returncode != 0:
                raise RuntimeError(f"train {variant} failed: see {OUT / f'{variant}-{tag}.log'}")
            (OUT / f"{variant}-{tag}.json").write_text(stdout)
    drafters = {**{f"committed {v}": fixture.COMMITTED / v for v in args.variants},
                **{f"{folder}": folder for folder in args.compare},
                **{f"train {tag} {v}": out for v, out in runs.items()}}
    jobs = [(name, folder, held, path) for name, folder in drafters.items()
            for held, path in held_out.items()]

    def one(job) -> dict:
        name, folder, held, path = job
        log(f"measuring {name} on {held}")
        return {"drafter": name, "held_out": held, **measure(target, folder, path)}

    with ThreadPoolExecutor(max_workers=2) as pool:  # one validate a core, one thread each
        rows = list(pool.map(one, jobs))
    (OUT / f"results-{tag}.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("| drafter | held-out prompts | tau | acceptance | lossless |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['drafter']} | {r['held_out']} ({r['prompts']}) | {r['tau']:.2f} | "
              f"{r['acceptance_rate']:.2f} | {'yes' if r['lossless'] else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
