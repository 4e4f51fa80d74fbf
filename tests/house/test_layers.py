"""Layers import one way (issues 22, 34): base <- model (gguf/, hub/) <- options <- convert <- runner <-
quantize/validation <- release, train.

Every module of the package is parsed (ast, nothing is imported) and each import it makes, at the
top or inside a function, is resolved to the layer it reaches; an import of a higher layer fails
this test, naming the file, the line and the layer. The base (dflash_gguf/*.py: errors, inputs, the
confined and typed readers, the secret filter, licenses, hashing) imports nothing above it. The model layer is dflash_gguf/gguf/ (GGUF and checkpoint files, key names, describe, the
target) and dflash_gguf/hub/ (repo ids, the Hub, its client and cache), which use each other: a
target is read from a file or from the Hub, and the Hub reads a remote GGUF's header. The command
line's vocabulary (dflash_gguf/options.py) sits on the model layer: its --target takes a Hub repo id. Only the
command line (dflash_gguf/cli.py, which gathers every command, and cli_docs.py, which documents
them) sits on top. quantize/ may use runner/ (the llama-quantize binary comes from the build), not
the reverse.
"""
from __future__ import annotations

import ast
import tokenize
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "dflash_gguf"
# rank of each layer: a module may import its own layer and those of lower rank
LAYERS = {"base": 0, "model": 1, "options": 1.5, "convert": 2, "runner": 3, "quantize": 4, "validation": 4, "release": 5, "train": 5,
          "ggml_patches": 0, "entry": 9}
MODEL = ("gguf", "hub")  # dflash_gguf.gguf, dflash_gguf.hub: the model layer, folders inside dflash_gguf/
ENTRY = {"dflash_gguf/cli.py", "dflash_gguf/cli_docs.py"}
OPTIONS = "options"  # dflash_gguf/options.py


def _package_dirs() -> dict[str, Path]:
    """dflash_gguf.<sub> -> its folder, as pyproject maps them."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    mapped = config["tool"]["setuptools"].get("package-dir", {})
    return {name: REPO / folder for name, folder in mapped.items()}


def _layer_of_module(module: str) -> str | None:
    """The layer of an absolute module name inside the package (None for anything outside it)."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    if len(parts) == 1:
        return "base"
    sub = parts[1]
    if sub in MODEL:
        return "model"
    if sub == OPTIONS:
        return "options"
    return sub if f"{PACKAGE}.{sub}" in _package_dirs() else "base"


def _modules() -> list[tuple[Path, str, str]]:
    """(file, its module name, its layer) for every module of the package."""
    out = []
    for path in sorted((REPO / PACKAGE).glob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        out.append((path, f"{PACKAGE}.{path.stem}",
                    "entry" if rel in ENTRY else "options" if path.stem == OPTIONS else "base"))
    for sub in MODEL:
        for path in sorted((REPO / PACKAGE / sub).glob("*.py")):
            out.append((path, f"{PACKAGE}.{sub}.{path.stem}", "model"))
    for name, folder in _package_dirs().items():
        for path in sorted(folder.rglob("*.py")):
            sub = ".".join(path.relative_to(folder).with_suffix("").parts)
            out.append((path, f"{name}.{sub}", name.split(".")[1]))
    return out


def _imports(path: Path, module: str):
    """(line, absolute module imported) for every import in the file."""
    package = module.rsplit(".", 1)[0]  # a module's package (pkg.__init__ -> pkg)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if node.module is None or _layer_of_module(target) == "base" and target == PACKAGE:
                for alias in node.names:  # `from .. import values`: the names are modules
                    yield node.lineno, f"{target}.{alias.name}"
            else:
                yield node.lineno, target


DOC = REPO / "docs" / "testing.md"


def _folders(layer: str) -> list[str]:
    """Where a layer's modules are, as the repository spells them."""
    if layer == "base":
        return [f"{PACKAGE}/*.py"]
    if layer == "model":
        return [f"{PACKAGE}/{sub}/" for sub in MODEL]
    if layer == "options":
        return [f"{PACKAGE}/{OPTIONS}.py"]
    if layer == "entry":
        return sorted(ENTRY)
    return [f"{_package_dirs()[f'{PACKAGE}.{layer}'].relative_to(REPO).as_posix()}/"]


def stated_layering() -> str:
    """The layering as docs/testing.md states it, made from LAYERS: lowest first, the layers of one rank
    joined by '/', then where each layer's modules are."""
    order = list(LAYERS)
    ranks = sorted(set(LAYERS.values()))
    chain = " <- ".join("/".join(sorted((n for n, r in LAYERS.items() if r == rank), key=order.index))
                        for rank in ranks)
    where = "; ".join(f"{name}: {', '.join(_folders(name))}" for name in sorted(LAYERS, key=LAYERS.get))
    return f"{chain} ({where})"


def _doc_paragraph(text: str, opening: str) -> str:
    """The list item of docs/testing.md that opens with `opening`, its lines joined by single spaces."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(opening))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("  ")), len(lines))
    return " ".join(line.strip() for line in lines[start:end])


def test_docs_state_the_layering_this_test_holds():
    """docs/testing.md states the layering from this file's LAYERS, not by hand (issue 50: it once said
    `dflash_gguf <- convert <- quantize/runner <- release` while this test held another order)."""
    stated = _doc_paragraph(DOC.read_text(encoding="utf-8"), "- `tests/house/test_layers.py`")
    assert stated_layering() in stated.replace("`", ""), \
        f"docs/testing.md: write the layering as tests/house/test_layers.py holds it:\n{stated_layering()}"


def test_every_layer_is_declared():
    for name in _package_dirs():
        assert name.split(".")[1] in LAYERS, f"{name}: give its layer in tests/house/test_layers.py LAYERS"


@pytest.mark.parametrize("path, module, layer", _modules(), ids=lambda v: v if isinstance(v, str) else None)
def test_imports_go_down_the_layers(path, module, layer):
    wrong = []
    for line, target in _imports(path, module):
        reached = _layer_of_module(target)
        if reached is not None and LAYERS[reached] > LAYERS[layer]:
            wrong.append(f"{path.relative_to(REPO)}:{line} ({layer}) imports {target} ({reached})")
    assert not wrong, f"imports against the layers ({stated_layering()}):\n" + "\n".join(wrong)


def test_the_scan_sees_an_upward_import(tmp_path):
    """The scan itself: an import of a higher layer, relative or absolute, is found."""
    bad = tmp_path / "x.py"
    bad.write_text("from ..release.license_rules import License\nimport dflash_gguf.runner.build\n"
                   "def f():\n    from .. import release\n")
    found = [target for _, target in _imports(bad, "dflash_gguf.convert.x")]
    assert [_layer_of_module(t) for t in found] == ["release", "runner", "release"], found
    base = tmp_path / "base.py"
    base.write_text("from .gguf.reader import GGUFFile\nfrom .hub import resolve\n")
    found = [target for _, target in _imports(base, "dflash_gguf.base")]
    assert [_layer_of_module(t) for t in found] == ["model", "model"], found


REASONS = ("extra:", "cycle:", "startup:", "after:")


def _unexplained_function_imports(path: Path) -> list[int]:
    """Lines of imports inside functions with no reason: a comment starting with one of REASONS on the
    import's line, or above the run of imports it belongs to."""
    lines = path.read_text().split("\n")
    found = []
    for fn in ast.walk(ast.parse("\n".join(lines), str(path))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            line = node.lineno - 1
            if lines[line].partition("#")[2].strip().startswith(REASONS):
                continue
            while line > 0 and lines[line - 1].strip().startswith(("import ", "from ")):
                line -= 1  # the run of imports this one belongs to
            if not lines[line - 1].strip().lstrip("#").strip().startswith(REASONS):
                found.append(node.lineno)
    return sorted(set(found))


def test_every_import_inside_a_function_says_why():
    """An import inside a function is there for a reason the top of the module cannot serve: an optional
    extra, a cycle, the command line's start-up time, or an order (after a check or a set-up); it says
    which. Anything else goes at the top."""
    missing = [f"{path.relative_to(REPO)}:{line}" for path, _, _ in _modules()
               for line in _unexplained_function_imports(path)]
    assert missing == [], f"imports inside functions without a reason ({', '.join(REASONS)}): {missing}"


def test_the_reason_check_sees_an_unexplained_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    # extra: torch\n    import torch\n    import numpy\n\n"
                      "def g():\n    import json\n    x = 1\n    import os  # startup: fine\n")
    assert _unexplained_function_imports(module) == [7]


def test_no_relative_import_climbs_out_of_a_top_level_folder():
    """The folders pyproject maps into the package (convert/, runner/, ...) sit beside dflash_gguf/ on
    disk, not inside it: a `from ..x import` there climbs to a folder that is not where a reader looks.
    Such imports name the package (`from dflash_gguf.x import ...`); relative ones stay within a folder."""
    climbing = []
    for name, folder in _package_dirs().items():
        for path in sorted(folder.rglob("*.py")):
            depth = len(path.relative_to(folder).parts)  # 1: a module at the folder's top
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.level > depth:
                    climbing.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert climbing == [], f"relative imports out of their top-level folder (use dflash_gguf.<room>): {climbing}"


# Beside the product: training/ (its fixtures/ build the models the tests use) <- benchmarks/ <- tests/;
# each folder may not import those it names
DEV_SIDE = {"training": ("tests", "benchmarks"), "benchmarks": ("tests",)}
TEST_SIDE = ("tests", *DEV_SIDE)  # nothing of the product imports these


def _imports_under(path: Path, module: str, roots: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, module) for each import of a module inside one of the top-level packages `roots`."""
    return [(line, target) for line, target in _imports(path, module) if target.split(".")[0] in roots]


def _toy_names(path: Path) -> list[tuple[int, str]]:
    """(line, name) for each TOY_ name in the code, comments and strings aside."""
    with tokenize.open(path) as f:
        return [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(f.readline)
                if tok.type == tokenize.NAME and tok.string.startswith("TOY_")]


def test_training_and_benchmarks_import_nothing_from_tests():
    """training/ and benchmarks/ build and measure the models the tests use (training/fixtures/): the
    tests import them, never the reverse (issue 50); benchmarks/ import training/, never the reverse."""
    found = [f"{path.relative_to(REPO)}:{line} imports {target}"
             for folder, above in DEV_SIDE.items() for path in sorted((REPO / folder).rglob("*.py"))
             for line, target in _imports_under(path, ".".join(path.relative_to(REPO).with_suffix("").parts), above)]
    assert found == [], "move what they need into training/fixtures/:\n" + "\n".join(found)


def test_the_product_holds_no_toy_and_imports_no_fixture():
    """The zoo's toy geometry (TOY_*, each family's toy config) lives in training/fixtures/toys.py; the
    product keeps what it reads of a family (dflash_gguf/families.py) and imports nothing from tests/,
    training/ or benchmarks/ (issue 50)."""
    found = [f"{path.relative_to(REPO)}:{line} imports {target}" for path, module, _ in _modules()
             for line, target in _imports_under(path, module, TEST_SIDE)]
    found += [f"{path.relative_to(REPO)}:{line} {name}" for path, _, _ in _modules() for line, name in _toy_names(path)]
    assert found == [], "test-only code in the product (its place is training/fixtures/):\n" + "\n".join(found)


def test_the_scans_see_a_fixture_import_and_a_toy_name(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("from tests.fixtures import published_drafters\nimport training.fixtures.toys\n"
                   "from dflash_gguf.paths import cache_dir\n"
                   "def f():\n    from tests.warm import run_cli  # TOY_IN_A_COMMENT\n    return 'TOY_X', TOY_HIDDEN\n")
    assert _imports_under(bad, "dflash_gguf.x", ("tests",)) == [(1, "tests.fixtures"), (5, "tests.warm")]
    assert [line for line, _ in _imports_under(bad, "dflash_gguf.x", TEST_SIDE)] == [1, 2, 5]
    assert _toy_names(bad) == [(6, "TOY_HIDDEN")]


def test_a_fixture_key_follows_the_code_not_where_its_modules_live():
    """Fixture keys read the building code through training/fixtures/code_key.py: moving a module the
    builder imports (tests/fixtures -> training/fixtures) keeps every cached fixture, a change to the
    code or to the names it imports does not."""
    from training.fixtures.code_key import code_bytes

    builder = ("from tests.fixtures.qwen2_style import qwen2_style\n\n"
               "def f():\n    from tests.upstream import run\n    return run(qwen2_style)\n")
    moved = builder.replace("tests.fixtures.", "training.fixtures.").replace("tests.upstream", "training.fixtures.upstream")
    assert code_bytes(moved) == code_bytes(builder)
    assert code_bytes(builder.replace("return run(", "return 2 * run(")) != code_bytes(builder)
    assert code_bytes(builder.replace("import run", "import run_fast")) != code_bytes(builder)


TEST_ROOMS = {"base", "gguf", "hub", "convert", "runner", "validation", "quantize", "release", "train", "house"}


def test_every_test_module_lives_in_the_folder_of_its_room():
    """tests/ mirrors the product's rooms (and `house` for the whole: layers, docs, zoo, fixtures): no
    test module directly in tests/, no folder of tests that is not a room."""
    tests = REPO / "tests"
    assert not sorted(p.name for p in tests.glob("test_*.py"))
    folders = {p.parent.relative_to(tests).parts[0] for p in tests.rglob("test_*.py") if "fixtures" not in p.parts}
    assert folders <= TEST_ROOMS, folders - TEST_ROOMS
    rooms = {name for name in _package_dirs() if name.count(".") == 1}
    assert {r.split(".")[1] for r in rooms} | set(MODEL) | {"base", "house"} >= folders
