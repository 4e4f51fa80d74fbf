"""Prompts for validate, tune and doctor: a built-in mix, or a file the user wrote.

Two file formats, told apart by name or content:
- one prompt per line (`\\n` in a line stands for a newline), sent as it is;
- JSONL (a `.jsonl` file, or any file whose first non-blank line is a JSON object): one object
  per line, `{"messages": [{"role": ..., "content": ...}, ...]}` or `{"prompt": "..."}`. A
  conversation is rendered by the target's own chat template exactly as llama-server renders a
  `/v1/chat/completions` request: the running server's `/apply-template` renders it (its Jinja
  engine, the GGUF's `tokenizer.chat_template`, a `--chat-template` given after `--`), then
  `/tokenize` with the flags that request uses (special tokens added and parsed).

Every command reads prompts with `read_prompts` and turns them into token ids with `tokenize_prompts`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence, Union

from dflash_gguf.errors import InputError
from dflash_gguf.inputs import read_text

if TYPE_CHECKING:
    from .client import LlamaClient

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

JSONL_SUFFIXES = (".jsonl", ".ndjson")
ROLES = ("system", "user", "assistant", "tool")
# What a chat template adds around the messages, for sizing a server's context before it has rendered
# them (the bound is in bytes, which a BPE tokenizer never exceeds in tokens): the role markers of
# each message, and a default system prompt or date line of the template's own.
TEMPLATE_BYTES_PER_MESSAGE = 64
TEMPLATE_BYTES = 2048


@dataclass(frozen=True)
class ChatPrompt:
    """A conversation, rendered by the target's chat template when it is sent."""

    messages: tuple[dict[str, str], ...]

    def __str__(self) -> str:
        """What reports show: the last message, as the user wrote it."""
        return self.messages[-1]["content"]

    def size_bound(self) -> int:
        return (sum(len(m["content"].encode()) for m in self.messages)
                + TEMPLATE_BYTES_PER_MESSAGE * len(self.messages) + TEMPLATE_BYTES)


Prompt = Union[str, ChatPrompt]


def read_prompts(path: str | Path) -> list[Prompt]:
    """The prompts of a file in either format (see the module's docstring)."""
    path = Path(path)
    # only \n (and \r\n) end a line: str.splitlines also splits at U+2028, U+0085 and form feeds,
    # which a JSON string may hold as they are
    lines = [line.removesuffix("\r") for line in read_text(path, "prompts file").split("\n")]
    if is_jsonl(path, lines):
        prompts = [_jsonl_prompt(path, number, line) for number, line in enumerate(lines, 1) if line.strip()]
        expected = 'one JSON object per line: {"messages": [...]} or {"prompt": "..."}'
    else:
        prompts = [_unescape(line) for line in lines if line.strip()]
        expected = "one prompt per line"
    if not prompts:
        raise InputError(f"{path}: no prompts (expected {expected})")
    return prompts


def is_jsonl(path: Path, lines: Sequence[str]) -> bool:
    if path.suffix.lower() in JSONL_SUFFIXES:
        return True
    first = next((line.strip() for line in lines if line.strip()), "")
    if not first.startswith("{"):
        return False
    try:
        return isinstance(json.loads(first), dict)
    except (ValueError, RecursionError):
        return False


def size_bound(prompt: Prompt) -> int:
    """An upper bound on the prompt's length in tokens (its bytes, with the template's for a chat)."""
    return prompt.size_bound() if isinstance(prompt, ChatPrompt) else len(prompt.encode())


def tokenize_prompts(client: "LlamaClient", prompts: Sequence[Prompt]) -> list[list[int]]:
    """Every prompt as the token ids the server at `client` would evaluate for it."""
    ids = []
    for prompt in prompts:
        text = client.apply_template(list(prompt.messages)) if isinstance(prompt, ChatPrompt) else prompt
        tokens = client.tokenize(text, add_special=True, parse_special=True)
        if not tokens:
            raise InputError(f"prompt {str(prompt)[:40]!r} tokenizes to nothing; give a non-empty prompt")
        ids.append(tokens)
    return ids


def _jsonl_prompt(path: Path, number: int, line: str) -> Prompt:
    where = f"{path}:{number}"
    try:
        record = json.loads(line)
    except ValueError as err:
        raise InputError(f"{where}: not JSON ({getattr(err, 'msg', err)}); each line is one object, "
                         '{"messages": [...]} or {"prompt": "..."}') from None
    except RecursionError:
        raise InputError(f"{where}: JSON nested too deeply to be a prompt") from None
    if not isinstance(record, dict):
        raise InputError(f'{where}: a JSON {type(record).__name__}; each line is one object, '
                         '{"messages": [...]} or {"prompt": "..."}')
    if ("messages" in record) == ("prompt" in record):
        raise InputError(f'{where}: give exactly one of the fields "messages" (a conversation) and "prompt" (text)')
    if "prompt" in record:
        text = record["prompt"]
        if not isinstance(text, str) or not text.strip():
            raise InputError(f'{where}: field "prompt" must be a non-empty string')
        return _text(where, "prompt", text)
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise InputError(f'{where}: field "messages" must be a non-empty list of {{"role", "content"}} objects')
    return ChatPrompt(tuple(_message(where, i, m) for i, m in enumerate(messages)))


def _message(where: str, i: int, message: object) -> dict[str, str]:
    field = f"messages[{i}]"
    if not isinstance(message, dict):
        raise InputError(f'{where}: field "{field}" must be an object with "role" and "content"')
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        raise InputError(f'{where}: field "{field}.role" must be one of {", ".join(ROLES)} (found {role!r})')
    if isinstance(content, list):  # OpenAI content parts: text only
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise InputError(f'{where}: field "{field}.content" parts must each be {{"type": "text", "text": "..."}}')
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise InputError(f'{where}: field "{field}.content" must be a string')
    return {"role": role, "content": _text(where, f"{field}.content", content)}


def _text(where: str, field: str, value: str) -> str:
    """A JSON string that is text: a `\\ud800` escape alone (a lone surrogate) is no character and encodes
    as nothing a server or tokenizer can take."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InputError(f'{where}: field "{field}" holds a lone surrogate (\\u{ord(value[err.start]):04x}), which is '
                         "not text; write the character itself or its full surrogate pair") from None
    return value


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
