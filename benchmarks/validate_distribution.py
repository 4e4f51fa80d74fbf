"""Both error rates of `validate --temperature`, measured on the trained pair (`make fixtures`).

    .venv/bin/python -m benchmarks.validate_distribution [--seeds 20] [--power-seeds 5] [--drafters dflash,dflash2]

- false alarms: each real drafter (DFlash, DFlash 2) against the target alone, `--seeds` runs (DFlash
  with seeds 0, 1, ..., DFlash 2 with 100, 101, ...): how often the verdict is "different" at
  alpha = 0.01 (an exact test would say so in about 1 run of 100). The seed ranges differ because
  with the same seed llama.cpp's speculative run returns the same tokens whichever drafter drafts:
  the same seeds would repeat one measurement;
- power: the DFlash drafter against a copy of the target whose output_norm.weight is scaled by 1.3
  (its logits scaled by 1.3: temperature T/1.3), `--power-seeds` runs: how often it is caught.

Every run is the default test (the held-out prompts, 200 samples of 8 tokens per prompt and set)
at temperature 0.6, top-k and top-p off, llama-server with 4 slots and 1 thread each (on a busy
2-core machine more threads only wait for each other).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from dflash_gguf.runner.prompts import read_prompts
from dflash_gguf.validation.validate import ValidationSettings
from dflash_gguf.validation.validate_sampled import Sampling, validate_distribution
from training.fixtures.trained_gguf import trained_ggufs
from training.fixtures.gguf_edit import scaled_copy

TEMPERATURE = 0.6
SHIFT = 1.3


def _run(target: Path, draft: Path, prompts: list[str], seed: int, baseline: Path | None = None) -> dict:
    settings = ValidationSettings(parallel=4, threads=1, backend="cpu")
    report = validate_distribution(target, draft, prompts, settings, Sampling(TEMPERATURE, seed=seed), baseline)
    d = report.distribution
    return {"seed": seed, "p_value": d.p_value, "verdict": d.verdict, "tests": d.tests,
            "mean_acceptance_length": report.mean_acceptance_length}


def _rate(runs: list[dict]) -> str:
    caught = sum(r["verdict"] == "different" for r in runs)
    return f"{caught}/{len(runs)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--power-seeds", type=int, default=5)
    parser.add_argument("--drafters", default="dflash,dflash2", help="comma-separated (--power-seeds 0 skips the power runs)")
    parser.add_argument("--json", type=Path, default=Path("build/bench/distribution.json"))
    args = parser.parse_args(argv)
    files = trained_ggufs()
    prompts = read_prompts(files["prompts"])
    results: dict = {"temperature": TEMPERATURE, "samples": Sampling.samples, "positions": Sampling.positions,
                     "alpha": Sampling.alpha, "prompts": len(prompts), "false_alarms": {}, "power": {}}
    started = time.monotonic()
    for index, drafter in enumerate(("dflash", "dflash2")):
        if drafter not in args.drafters.split(","):
            continue
        runs = []
        for seed in range(100 * index, 100 * index + args.seeds):
            runs.append(_run(files["target"], files[drafter], prompts, seed))
            print(f"{drafter} seed {seed}: p = {runs[-1]['p_value']:.3g} {runs[-1]['verdict']} "
                  f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
        results["false_alarms"][drafter] = {"rate": _rate(runs), "runs": runs}
    if args.power_seeds:
        with tempfile.TemporaryDirectory() as tmp:
            shifted = scaled_copy(files["target"], Path(tmp) / "target-shifted.gguf", "output_norm.weight", SHIFT)
            runs = []
            for seed in range(1000, 1000 + args.power_seeds):
                runs.append(_run(files["target"], files["dflash"], prompts, seed, baseline=shifted))
                print(f"shifted seed {seed}: p = {runs[-1]['p_value']:.3g} {runs[-1]['verdict']}",
                      file=sys.stderr, flush=True)
        results["power"] = {"baseline": f"output_norm.weight x {SHIFT}", "rate": _rate(runs), "runs": runs}
    return _report(args, results)


def _report(args: argparse.Namespace, results: dict) -> int:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    for drafter, r in results["false_alarms"].items():
        smallest = min(x["p_value"] for x in r["runs"])
        print(f"false alarms {drafter}: {r['rate']} at alpha {Sampling.alpha} (smallest p-value {smallest:.3g})")
    if results["power"]:
        p_values = ", ".join(f"{x['p_value']:.2g}" for x in results["power"]["runs"])
        print(f"power (output norm x {SHIFT}): caught {results['power']['rate']} (p-values {p_values})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
