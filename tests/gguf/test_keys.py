"""GGUF metadata keys are spelled in dflash_gguf/gguf/keys.py alone (its docstring says so; issue 50 found
train/frozen.py building `{arch}.attention.head_count` by hand and gguf/file.py, now gguf/reader.py,
spelling `general.*` keys of its own)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO
from tests.house.test_layers import _modules

KEYS = REPO / "dflash_gguf" / "gguf" / "keys.py"
# a metadata key: general.*, tokenizer.ggml.* / tokenizer.chat_template*, or a per-architecture template
KEY = re.compile(r"^(general\.[a-z_]|tokenizer\.(ggml\.|chat_template)|\{arch\}\.)")


def key_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return sorted(f"{path.name}:{node.lineno}: {node.value}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and KEY.match(node.value))


def test_no_module_spells_a_metadata_key_outside_the_key_table():
    found = [hit for path, _, _ in _modules() if path != KEYS for hit in key_literals(path)]
    assert found == [], "a GGUF key spelled outside dflash_gguf/gguf/keys.py (name it there):\n" + "\n".join(found)


def test_the_scan_sees_a_key(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('A = "general.basename"\nB = f"{{arch}}.{x}"\nC = "tokenizer.json"\n'
                      'def f(arch):\n    return per_arch("{arch}.rope.freq_base", arch), "tokenizer.ggml.tokens"\n')
    assert key_literals(module) == ["m.py:1: general.basename", "m.py:2: {arch}.", "m.py:5: tokenizer.ggml.tokens",
                                    "m.py:5: {arch}.rope.freq_base"]
