"""The drafter variants are one table (dflash_gguf/variants.py, issue 50): no module of the product, nor
the zoo's drafter fixture, spells a variant's class name outside it, so nothing branches on one; the
layout, `inspect`'s spec types, train's recipes and the docs read the table, and what they read is what
they held before it."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from dflash_gguf.gguf import describe, layout
from dflash_gguf.variants import ARCHITECTURES, VARIANTS, Variant, architecture
from tests.conftest import REPO
from tests.house.test_layers import _modules

TABLE = REPO / "dflash_gguf" / "variants.py"
FIXTURES = (REPO / "training" / "fixtures" / "family_drafters.py",)
CLASS_NAME = re.compile(r"\b(" + "|".join(map(re.escape, ARCHITECTURES)) + r")\b")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes (a command's --help is its docstring: prose, not a branch)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def class_name_literals(path: Path) -> list[str]:
    """`file:line: name` for every string literal (f-strings' parts too) that spells a variant's class."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skip = _docstrings(tree)
    return [f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path.name}:{node.lineno}: {m.group(1)}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            for m in CLASS_NAME.finditer(node.value)]


def test_no_class_name_outside_the_table():
    files = [path for path, _, _ in _modules() if path != TABLE] + list(FIXTURES)
    found = [hit for path in files for hit in class_name_literals(path)]
    assert found == [], "a drafter class name outside dflash_gguf/variants.py (read it from the table):\n" + \
        "\n".join(found)


def test_the_scan_sees_a_class_name(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""DFlashDraftModel in a docstring is prose."""\n'
                      'def f(spec, x):\n    """So is DSparkDraftModel here."""\n'
                      '    if spec["architecture"] == "DFlash2DraftModel":\n        return 1\n'
                      '    return f"dflash.{x}" if x else f"a LingDSparkModel {x}"\n'
                      'NAMES = {"DFlashDraftModelX": 1, "Qwen3DSparkModel": 2}\n')
    assert sorted(class_name_literals(module)) == ["m.py:4: DFlash2DraftModel", "m.py:6: LingDSparkModel",
                                           "m.py:7: Qwen3DSparkModel"]


def test_every_checkpoint_variant_names_its_reference_class():
    for variant, row in VARIANTS.items():
        if variant is Variant.LEGACY:
            assert row.architectures == () and row.reference_class is None
            with pytest.raises(ValueError, match="no checkpoint class"):
                architecture(variant)
        else:
            assert row.reference_class in row.architectures and row.reference_module, variant
            assert architecture(variant.value) == row.reference_class


def test_layout_and_describe_read_what_they_held():
    """The values these tables held as literals before they were read from the variant table (the
    converter's refusal lists ARCHITECTURES in this order; release names and inspect read the rest)."""
    assert list(layout.ARCHITECTURES.items()) == [
        ("DFlashDraftModel", "dflash"), ("DFlash2DraftModel", "dflash2"), ("Qwen3DSparkModel", "dspark"),
        ("DSparkDraftModel", "dspark"), ("DSparkSpeculator", "dspark"), ("Lfm2DSparkDraftModel", "dspark"),
        ("LingDSparkModel", "dspark")]
    assert layout.VARIANT_NAMES == {"dflash": "DFlash", "dflash2": "DFlash 2", "dspark": "DSpark",
                                    "legacy": "legacy fork"}
    assert layout.FILE_PREFIXES == {"dflash": "dflash", "dflash2": "dflash", "dspark": "dspark"}
    assert list(layout.VARIANT_MARKERS.items()) == [("selector_hidden.weight", "dflash2"),
                                                    ("markov_w1.weight", "dspark")]
    assert describe.SPEC_TYPES == {"dflash": "draft-dflash", "dflash2": "draft-dflash", "dspark": "draft-dspark"}
    assert (layout.DFLASH, layout.DFLASH2, layout.DSPARK, layout.LEGACY) == ("dflash", "dflash2", "dspark", "legacy")
    assert json.dumps({layout.DSPARK: layout.DSPARK}) == '{"dspark": "dspark"}'  # --json prints the name


@pytest.mark.torch  # the fixtures module imports torch
def test_train_recipes_take_class_and_block_from_the_table():
    from dflash_gguf.train import settings  # torch-free: the recipe's numbers and the plan

    assert {name: (spec["architecture"], spec["block_size"]) for name, spec in settings.VARIANTS.items()} == {
        "dflash": ("DFlashDraftModel", 16), "dflash2": ("DFlash2DraftModel", 8)}
    assert settings.ARCHITECTURES == {"DFlashDraftModel": "dflash", "DFlash2DraftModel": "dflash2"}
    # plain names: the run key hashes str(asdict(plan)), and a plan from --init must hash as one from --variant
    assert all(type(name) is str for name in settings.ARCHITECTURES.values())
    fields = set(VARIANTS[Variant.DFLASH2].config_fields)
    from training.fixtures.family_drafters import DFLASH2_TOY

    assert fields <= set(settings.VARIANTS["dflash2"]) and set(DFLASH2_TOY) == fields


def test_the_docs_name_every_architecture_the_converter_takes():
    text = (REPO / "docs" / "convert.md").read_text(encoding="utf-8")
    missing = [arch for arch in ARCHITECTURES if f"`{arch}`" not in text]
    assert missing == [], f"docs/convert.md does not name {missing}"


@pytest.mark.torch
@pytest.mark.parametrize("arch, expected", [
    ("DFlashDraftModel", ("dflash.model", "DFlashDraftModel")),
    ("DFlash2DraftModel", ("dflash.model", "DFlash2DraftModel")),
    ("Lfm2DSparkDraftModel", ("dflash_gguf.validation.dspark_reference", "DSparkDraftModel")),
    ("Qwen3ForCausalLM", ("dflash.model", "DFlashDraftModel")),  # a name the table lacks: DFlash's, as before
])
def test_validation_picks_the_reference_class_the_table_names(tmp_path, arch, expected):
    pytest.importorskip("dflash.model")
    from dflash_gguf.validation.reference import drafter_class

    (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch]}))
    cls = drafter_class(tmp_path)
    assert (cls.__module__, cls.__name__) == expected


@pytest.mark.torch
def test_train_writes_each_variants_config_as_before():
    """What train's branches on the variant make: DFlash's auto_map, DFlash 2's selector fields inside
    dflash_config, DSpark's settings at the top level."""
    pytest.importorskip("dflash.model")
    from dflash_gguf.train import recipe

    shape = recipe.DrafterShape(hidden=64, n_head=4, n_head_kv=2, head_dim=16, ffn=128, vocab=256, rope_theta=1e4,
                                rms_eps=1e-6, max_positions=256, num_target_layers=4, target_layer_ids=(0, 2),
                                mask_token_id=3, eos_token_id=2)
    base = {"num_layers": 1, "block_size": 4}
    dflash = recipe.drafter_config_dict({**base, "architecture": "DFlashDraftModel"}, shape)
    assert dflash["auto_map"] == {"AutoModel": "dflash.DFlashDraftModel"} and "markov_rank" not in dflash
    sizes = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}
    dflash2 = recipe.drafter_config_dict({**base, "architecture": "DFlash2DraftModel", **sizes}, shape)
    assert "auto_map" not in dflash2 and dflash2["dflash_config"] == {
        "block_size": 4, "mask_token_id": 3, "target_layer_ids": [0, 2], **sizes}
    dspark = recipe.drafter_config_dict({**base, "architecture": "DSparkDraftModel", "markov_rank": 8}, shape)
    assert "dflash_config" not in dspark and "auto_map" not in dspark
    assert (dspark["block_size"], dspark["markov_rank"], dspark["markov_head_type"]) == (4, 8, "vanilla")
    for spec, made in (({"architecture": "DFlash2DraftModel"}, "DFlash2DraftModel"),
                       ({"architecture": "DSparkDraftModel"}, "DSparkDraftModel")):
        assert recipe.drafter_class(spec["architecture"]).__name__ == made
