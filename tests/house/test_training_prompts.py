"""The SmolLM2 drafters' training prompts (training/smollm2_prompts.py): built offline, half code
and half chat, and never a held-out prompt or one naming a held-out prompt's subject; ShareGPT's
training draw (training/public_prompts.py), never one of its held-out turns."""

from __future__ import annotations

import json

from training.fixtures import smollm2 as fixture
from training.smollm2_prompts import build_prompts, names_a_held_out_subject


def _held_out_user_texts() -> list[str]:
    lines = fixture.EVAL_PROMPTS.read_text(encoding="utf-8").splitlines()
    return [m["content"] for line in lines for m in json.loads(line)["messages"] if m["role"] == "user"]


def test_every_held_out_prompt_names_a_held_out_subject():
    # the filter would let a paraphrase of this prompt into training otherwise
    assert [t for t in _held_out_user_texts() if not names_a_held_out_subject(t)] == []


def test_training_prompts_avoid_the_held_out_subjects_and_are_seeded():
    held = _held_out_user_texts()
    conversations = build_prompts(600, 7, held)
    assert len(conversations) == 600
    texts = [m["content"] for c in conversations for m in c["messages"] if m["role"] == "user"]
    assert not any(names_a_held_out_subject(t) for t in texts)
    assert not set(texts) & set(held)
    assert build_prompts(600, 7, held) == conversations
    assert build_prompts(600, 8, held) != conversations
    code = sum("python" in t.lower() or "```" in t for t in texts)
    assert 0.4 < code / len(texts) < 0.75  # half code requests (some chat prompts name Python too)


def test_public_training_turns_are_never_a_held_out_turn_however_typed():
    import pytest

    from training import public_prompts

    def norm(text: str) -> str:
        return " ".join(text.lower().split())

    base = [f"How do I sort a list of {n} numbers?" for n in range(300)]
    # ShareGPT holds the same request typed again: other case, other spacing
    turns = sorted(set(base) | {t.upper() for t in base} | {"  " + t.replace(" ", "   ") for t in base})
    held = {norm(t) for t in public_prompts.held_out(turns)}
    free = 300 - len(held)
    picked = public_prompts.training_turns(turns, free)
    assert len({norm(t) for t in picked}) == free  # every request once
    assert not [t for t in picked if norm(t) in held]
    assert public_prompts.training_turns(turns, free) == picked  # seeded
    with pytest.raises(SystemExit, match=f"{free + 1} training turns asked, {free} usable ones not held out"):
        public_prompts.training_turns(turns, free + 1)


def test_writingbench_requests_are_english_chat_sized_queries_once_each():
    from training import public_prompts

    ask = "Please help me draft an outline for a review paper on soil science."
    rows = [{"index": 1, "query": ask}, {"index": 2, "query": "  " + ask + "\n"},  # the same request twice
            {"index": 3, "query": "请帮我写一篇关于土壤科学的综述论文提纲。"},  # Chinese: not ASCII
            {"index": 4, "query": "Summarize this report:\n" + "Soil data. " * 60},  # pages of material
            {"index": 5, "query": "Short."}, {"index": 6, "checklist": []}]  # too short; no query
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    assert public_prompts.writing_requests(text) == [ask]
    assert public_prompts.SOURCES["writingbench"] is public_prompts.writing_requests
