"""Every `from dflash_gguf... import name` in the repository resolves, the ones inside functions too:
a module moved to another package (runner -> validation) once left a benchmark importing from where
it was, which nothing ran until the benchmark itself did."""

from __future__ import annotations

import ast
import importlib

import pytest

from tests.conftest import REPO
from tests.test_layers import _package_dirs

# folder -> the package its modules are imported as (pyproject's package-dir; the rest by their name)
PACKAGE_OF = {folder.name: name for name, folder in _package_dirs().items()}
FOLDERS = ("dflash_gguf", *PACKAGE_OF, "benchmarks", "training", "examples", "tests")


def _imports():
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            package = PACKAGE_OF.get(folder, folder)
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            here = ".".join([package, *parts[:-1]])
            for node in ast.walk(tree):
                if not isinstance(node, ast.ImportFrom):
                    continue
                if node.level:
                    base = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                    module = f"{base}.{node.module}" if node.module else base
                else:
                    module = node.module or ""
                if module == "dflash_gguf" or module.startswith("dflash_gguf."):
                    yield f"{path.relative_to(REPO)}:{node.lineno}", module, [a.name for a in node.names]


IMPORTS = list(_imports())


def test_the_scan_sees_function_level_imports():
    assert any(where.startswith("benchmarks/real_target.py") for where, _, _ in IMPORTS)


@pytest.mark.parametrize("where,module,names", IMPORTS, ids=[i[0] for i in IMPORTS])
def test_import_resolves(where, module, names):
    loaded = importlib.import_module(module)
    for name in names:
        if name != "*" and not hasattr(loaded, name):
            importlib.import_module(f"{module}.{name}")  # a submodule imported by name
