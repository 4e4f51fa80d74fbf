"""Prompts for validation: a built-in mix, or a file with one prompt per line."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from ..inputs import read_text

BUILTIN_PROMPTS: tuple[str, ...] = (
    # code
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import json\nfrom pathlib import Path\n\n\ndef load_config(path):\n",
    "class LRUCache:\n    def __init__(self, capacity: int):\n",
    # math
    "Question: A train travels 120 km in 1.5 hours. What is its average speed in km/h?\nAnswer:",
    "Solve for x: 3x + 7 = 22. First, subtract 7 from both sides:",
    # prose
    "The history of the printing press begins in the fifteenth century, when",
    "Write a short paragraph describing a quiet morning in a mountain village.\n\n",
    # chat
    "<|im_start|>user\nHow do I reverse a list in Python?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a concise assistant.<|im_end|>\n<|im_start|>user\n"
    "Explain speculative decoding in two sentences.<|im_end|>\n<|im_start|>assistant\n",
)


def read_prompts(path: str | Path) -> list[str]:
    """One prompt per line; `\\n` in a line stands for a newline (`\\\\` for a backslash)."""
    path = Path(path)
    lines = read_text(path, "prompts file").splitlines()
    prompts = [_unescape(line) for line in lines if line.strip()]
    if not prompts:
        raise InputError(f"{path}: no prompts (expected one prompt per line)")
    return prompts


def _unescape(line: str) -> str:
    out, i = [], 0
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line) and line[i + 1] in "n\\t":
            out.append({"n": "\n", "t": "\t", "\\": "\\"}[line[i + 1]])
            i += 2
        else:
            out.append(line[i])
            i += 1
    return "".join(out)
