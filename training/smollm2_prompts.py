"""Chat prompts for training SmolLM2's drafters, built offline from what is installed here.

Every prompt is a chat conversation ({"messages": [...]}), half code requests, half chat:

    code   from the CPython standard library's source, parsed with `ast`: "write a function that
           <its docstring's first sentence>", "explain / document / review this function", and
           "how do I use <module>.<function>"
    docs   from `pydoc_data.topics` (the language reference pages behind `help()`) and module
           docstrings: "explain this Python feature", "summarise this passage"
    ask    what beginners ask: hand-written Python concepts and small programming tasks
           (training/smollm2_subjects.py) crossed with question and request templates
    chat   everyday requests: hand-written templates (advice, short writing, explanations)
           crossed with hand-written activities and subjects

The code half is 60 % `ask`, 40 % stdlib; the chat half 75 % everyday, 25 % docs. A quarter of the
conversations open with one of a few system messages; the others get the chat template's default
one. Nothing here comes from tests/fixtures/smollm2/eval_prompts.jsonl (the held-out prompts,
written by hand): `build_prompts` drops any prompt equal to one of them or naming one of their
subjects (smollm2_subjects.HELD_OUT_SUBJECTS).
"""

from __future__ import annotations

import ast
import random
import re
import sysconfig
from pathlib import Path

from training.smollm2_subjects import (
    CHAT_REQUEST_TEMPLATES, CODE_QUESTION_TEMPLATES, CODE_TASK_TEMPLATES, EVERYDAY_ACTIVITIES,
    EVERYDAY_SUBJECTS, HELD_OUT_SUBJECTS, PROGRAMMING_TASKS, PYTHON_CONCEPTS)

SYSTEM_MESSAGES = (
    "You are a helpful assistant.",
    "You are a concise assistant. Keep answers short.",
    "You are an experienced Python developer who writes clean, readable code.",
    "You are a patient teacher who explains things step by step.",
    "You are a friendly assistant for beginners.",
)

CODE_TEMPLATES = (
    "Write a Python function `{name}({args})` that {summary}",
    "Can you write Python code that {summary} Please include an example.",
    "Implement `{name}` in Python: it {summary}",
)
EXPLAIN_TEMPLATES = (
    "Explain what this Python function does:\n\n```python\n{source}\n```",
    "Write a docstring for this function:\n\n```python\n{source}\n```",
    "How could this code be improved?\n\n```python\n{source}\n```",
    "What does this code return, and when could it fail?\n\n```python\n{source}\n```",
)
USAGE_TEMPLATES = (
    "How do I use `{module}.{name}` in Python? Show a short example.",
    "What is the `{module}` module in Python used for?",
)
TOPIC_TEMPLATES = (
    "Explain Python's {topic} with an example.",
    "What should a beginner know about {topic} in Python?",
    "Summarize this passage from the Python documentation:\n\n{passage}",
    "Explain this in simpler words:\n\n{passage}",
)


def _summary(docstring: str) -> str | None:
    """A docstring's first sentence as an instruction tail ("returns the ..."), or None."""
    first = docstring.strip().split("\n\n")[0].replace("\n", " ")
    first = re.split(r"(?<=[.!?])\s", first)[0].strip()
    if not 20 <= len(first) <= 160 or not first[0].isupper() or ">>>" in first:
        return None
    words = first.split()
    verb = words[0]
    # "Return the x." -> "returns the x." (imperative docstrings read as a description)
    if verb.isalpha() and not verb.endswith("s"):
        verb = verb + ("es" if verb.endswith(("sh", "ch", "x")) else "s")
    text = " ".join([verb.lower(), *words[1:]])
    return text if text.endswith((".", "?", "!")) else text + "."


def _segment(lines: list[bytes], node: ast.AST) -> str:
    """ast.get_source_segment(text, node) for lines split once (it splits the whole text per call:
    34 s of the 35 s the standard library's functions took)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first][node.col_offset:node.end_col_offset].decode()
    return b"".join([lines[first][node.col_offset:], *lines[first + 1:last],
                     lines[last][:node.end_col_offset]]).decode()


def _functions(path: Path):
    """(module, name, args, docstring, source) for the public top-level functions of a file."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return
    # as the parser (and ast.get_source_segment) split: at \r\n, \r and \n only
    lines = [line.encode() for line in re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", text)]
    module = path.stem
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        source = _segment(lines, node)
        args = ", ".join(a.arg for a in node.args.args)
        yield module, node.name, args, doc, source


def stdlib_sources() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return [p for p in sorted(root.glob("*.py")) if not p.name.startswith("_")]


def code_prompts(rng: random.Random) -> list[str]:
    out = []
    for path in stdlib_sources():
        for module, name, args, doc, source in _functions(path):
            summary = _summary(doc) if doc else None
            if summary:
                out.append(rng.choice(CODE_TEMPLATES).format(name=name, args=args, summary=summary))
                out.append(rng.choice(USAGE_TEMPLATES).format(module=module, name=name))
            lines = source.splitlines()
            if 3 <= len(lines) <= 24 and len(source) <= 900:
                # without its docstring, so "write a docstring" is a real request
                body = re.sub(r'\n\s+("""|\'\'\')[\s\S]*?\1', "", source, count=1) if doc else source
                out.append(rng.choice(EXPLAIN_TEMPLATES).format(source=body))
    return out


def doc_prompts(rng: random.Random) -> list[str]:
    from pydoc_data.topics import topics

    out = []
    for topic, text in sorted(topics.items()):
        label = topic.replace("-", " ")
        out.append(TOPIC_TEMPLATES[0].format(topic=f"`{label}`"))
        out.append(TOPIC_TEMPLATES[1].format(topic=f"`{label}`"))
        paragraphs = [p.strip() for p in text.split("\n\n")
                      if 200 <= len(p.strip()) <= 700 and not p.strip().startswith((" ", ">>>", "*"))]
        for passage in rng.sample(paragraphs, min(4, len(paragraphs))):
            out.append(rng.choice(TOPIC_TEMPLATES[2:]).format(passage=" ".join(passage.split())))
    return out


def ask_prompts() -> list[str]:
    return ([t.format(concept=c) for t in CODE_QUESTION_TEMPLATES for c in PYTHON_CONCEPTS]
            + [t.format(task=task) for t in CODE_TASK_TEMPLATES for task in PROGRAMMING_TASKS])


def chat_prompts() -> list[str]:
    out = []
    for template in CHAT_REQUEST_TEMPLATES:
        for subject in EVERYDAY_ACTIVITIES if "{activity}" in template else EVERYDAY_SUBJECTS:
            out.append(template.format(activity=subject, thing=subject))
    return out


def names_a_held_out_subject(text: str) -> bool:
    lowered = text.lower()
    return any(subject in lowered for subject in HELD_OUT_SUBJECTS)


def _take(pools: list[tuple[list[str], float]], count: int, rng: random.Random) -> list[str]:
    """`count` prompts, each pool giving its share (the last one the rest), seeded."""
    picked = []
    for i, (pool, share) in enumerate(pools):
        want = count - len(picked) if i == len(pools) - 1 else round(count * share)
        pool = list(pool)
        rng.shuffle(pool)
        if len(pool) < want:
            raise RuntimeError(f"a prompt pool holds {len(pool)} prompts here; asked for {want}")
        picked += pool[:want]
    return picked


def build_prompts(count: int, seed: int, held_out: list[str]) -> list[dict]:
    """`count` conversations, half code and half chat, in a seeded order."""
    rng = random.Random(seed)
    held = set(held_out)

    def allowed(pool):
        return [text for text in pool if text not in held and not names_a_held_out_subject(text)]

    half = count // 2
    picked = (_take([(allowed(ask_prompts()), 0.6), (allowed(code_prompts(rng)), 0.4)], half, rng)
              + _take([(allowed(chat_prompts()), 0.75), (allowed(doc_prompts(rng)), 0.25)], count - half, rng))
    rng.shuffle(picked)
    conversations = []
    for text in picked:
        messages = [{"role": "user", "content": text}]
        if rng.random() < 0.25:
            messages.insert(0, {"role": "system", "content": rng.choice(SYSTEM_MESSAGES)})
        conversations.append({"messages": messages})
    return conversations


def prompt_counts() -> dict[str, int]:
    rng = random.Random(0)
    return {"ask": len(ask_prompts()), "code": len(code_prompts(rng)), "docs": len(doc_prompts(rng)),
            "chat": len(chat_prompts())}


if __name__ == "__main__":
    import json

    print(json.dumps(prompt_counts()))
    for c in build_prompts(6, 1, []):
        print(json.dumps(c)[:300])
