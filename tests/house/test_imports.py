"""Every `from dflash_gguf... import name` in the repository resolves, the ones inside functions too:
a module moved to another package (runner -> validation) once left a benchmark importing from where
it was, which nothing ran until the benchmark itself did."""

from __future__ import annotations

import ast
import importlib

import pytest

from tests.conftest import REPO
from tests.house.test_layers import _modules, _package_dirs
from tests.tiers import HEAVY_MODULES

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


def _top_level_imports(path) -> set[str]:
    """What importing the module itself imports (not its functions' imports, nor what only a type checker
    reads), absolute names."""
    module = {str(p): m for p, m, _ in _modules()}[str(path)]
    package = module.rsplit(".", 1)[0]
    names, todo = set(), list(ast.parse(path.read_text(encoding="utf-8")).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue  # for the type checker only: never imported when the module is
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            names |= {target} | {f"{target}.{a.name}" for a in node.names}
        todo.extend(ast.iter_child_nodes(node))
    return names


def _needing_torch() -> set[str]:
    """Modules of the package whose import pulls in PyTorch, transformers or the z-lab reference."""
    direct = {m: _top_level_imports(p) for p, m, _ in _modules()}
    heavy = {m for m, names in direct.items() if any(n.split(".")[0] in HEAVY_MODULES for n in names)}
    while True:
        more = {m for m, names in direct.items() if m not in heavy and names & heavy}
        if not more:
            return heavy
        heavy |= more


NEEDS_TORCH = _needing_torch()
BY_MODULE: dict[str, list[tuple[str, list[str]]]] = {}
for _where, _module, _names in IMPORTS:
    BY_MODULE.setdefault(_module, []).append((_where, _names))


def test_the_scan_sees_function_level_imports():
    assert any(where.startswith("benchmarks/real_target.py") for where, _, _ in IMPORTS)
    assert "dflash_gguf.validation.dspark_reference" in NEEDS_TORCH and "dflash_gguf.convert.converter" not in NEEDS_TORCH


def _needs_torch(module: str) -> bool:
    """Importing `module`, or a submodule some file imports from it by name, pulls in PyTorch."""
    return module in NEEDS_TORCH or any(f"{module}.{name}" in NEEDS_TORCH
                                        for _, names in BY_MODULE[module] for name in names)


@pytest.mark.parametrize("module", [pytest.param(m, marks=[pytest.mark.torch] if _needs_torch(m) else [])
                                    for m in sorted(BY_MODULE)])
def test_imports_resolve(module):
    """Every name any file imports from `module` is there (one case per module imported)."""
    loaded = importlib.import_module(module)
    missing = []
    for where, names in BY_MODULE[module]:
        for name in names:
            if name == "*" or hasattr(loaded, name):
                continue
            try:
                importlib.import_module(f"{module}.{name}")  # a submodule imported by name
            except ModuleNotFoundError:
                missing.append(f"{where}: {name}")
    assert missing == []
