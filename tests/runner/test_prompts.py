"""Prompts files: one per line, or JSONL chat conversations; errors name the file, the line and the field."""

from __future__ import annotations

import json

import pytest

from dflash_gguf.errors import InputError
from dflash_gguf.runner.prompts import ChatPrompt, read_prompts, size_bound


def write(tmp_path, name: str, lines: list[str]):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_one_prompt_per_line_with_escapes(tmp_path):
    path = write(tmp_path, "p.txt", ["def f():\\n    return 1", "", "a \\\\n b"])
    assert read_prompts(path) == ["def f():\n    return 1", "a \\n b"]


def test_jsonl_messages_and_text(tmp_path):
    path = write(tmp_path, "p.jsonl", [
        json.dumps({"messages": [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Name a prime."}], "id": 7}),
        "",
        json.dumps({"prompt": "def add(a, b):\n"}),
        json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi "},
                                                              {"type": "text", "text": "there"}]}]}),
    ])
    chat, text, parts = read_prompts(path)
    assert isinstance(chat, ChatPrompt) and chat.messages == (
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."})
    assert str(chat) == "Name a prime."
    assert text == "def add(a, b):\n"
    assert parts.messages == ({"role": "user", "content": "Hi there"},)
    # the context bound covers the contents and what a template adds around them
    assert size_bound(chat) > len("Be brief.Name a prime.") + 1000
    assert size_bound(text) == len(text)


def test_jsonl_is_recognised_by_its_content_whatever_the_name(tmp_path):
    path = write(tmp_path, "prompts.txt", [json.dumps({"messages": [{"role": "user", "content": "Hello"}]})])
    assert read_prompts(path) == [ChatPrompt(({"role": "user", "content": "Hello"},))]


@pytest.mark.parametrize("line, message", [
    ('{"messages": [{"role": "user", "content": "x"}]', "p.jsonl:2: not JSON"),
    ('["a"]', "p.jsonl:2: a JSON list"),
    ('{"id": 3}', 'p.jsonl:2: give exactly one of the fields "messages"'),
    ('{"prompt": "a", "messages": []}', 'p.jsonl:2: give exactly one of the fields "messages"'),
    ('{"prompt": 5}', 'p.jsonl:2: field "prompt" must be a non-empty string'),
    ('{"messages": []}', 'p.jsonl:2: field "messages" must be a non-empty list'),
    ('{"messages": ["hi"]}', 'p.jsonl:2: field "messages[0]" must be an object'),
    ('{"messages": [{"role": "user", "content": "a"}, {"role": "usr", "content": "b"}]}',
     "p.jsonl:2: field \"messages[1].role\" must be one of system, user, assistant, tool (found 'usr')"),
    ('{"messages": [{"role": "user"}]}', 'p.jsonl:2: field "messages[0].content" must be a string'),
    ('{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
     'p.jsonl:2: field "messages[0].content" parts must each be'),
    ("[" * 100000, "p.jsonl:2: JSON nested too deeply"),
    ('{"prompt": "a\\ud800b"}', 'p.jsonl:2: field "prompt" holds a lone surrogate (\\ud800)'),
    ('{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
     'p.jsonl:2: field "messages[0].content" holds a lone surrogate (\\udfff)'),
])
def test_jsonl_errors_name_file_line_and_field(tmp_path, line, message):
    path = write(tmp_path, "p.jsonl", ['{"prompt": "fine"}', line])
    with pytest.raises(InputError) as err:
        read_prompts(path)
    assert str(err.value).startswith(str(tmp_path / message.split(":")[0]) + ":" + message.split(":", 1)[1])


def test_empty_jsonl_says_what_it_expects(tmp_path):
    path = write(tmp_path, "p.jsonl", ["", "  "])
    with pytest.raises(InputError, match=r'no prompts \(expected one JSON object per line'):
        read_prompts(path)
