"""`dflash-gguf convert` writes what the pinned upstream converter writes (plus provenance keys).

Each case runs the real upstream `convert_hf_to_gguf.py` from the llama-cpp-python 0.3.36 sdist
on the same fixture and compares metadata (values and types) and every tensor's name, shape, type
and bytes."""

from __future__ import annotations

import pytest

from dflash_gguf.gguf.reader import GGUFFile
from tests.conftest import dflash_gguf
from training.fixtures.tiny_models import DRAFTERS
from training.fixtures.gguf_compare import differences
from tests.legacy_fixture import make_legacy

pytestmark = pytest.mark.upstream


@pytest.mark.parametrize("target_kind", ["gguf", "hf"])
@pytest.mark.parametrize("drafter", sorted(DRAFTERS))
def test_matches_upstream_f16(drafter, target_kind, fixtures, target_gguf, upstream_gguf, tmp_path):
    target = target_gguf if target_kind == "gguf" else fixtures / "target-hf"
    out = tmp_path / "ours.gguf"
    proc = dflash_gguf("convert", fixtures / drafter, "--target", target, "-o", out, "--outtype", "f16")
    assert proc.returncode == 0, proc.stderr
    assert differences(out, upstream_gguf(drafter, "f16")) == []


@pytest.mark.parametrize("outtype", ["auto", "f32", "bf16", "q8_0"])
def test_matches_upstream_every_outtype(outtype, fixtures, target_gguf, upstream_gguf, tmp_path):
    out = tmp_path / "ours.gguf"
    proc = dflash_gguf("convert", fixtures / "dflash2-b8", "--target", target_gguf, "-o", out, "--outtype", outtype)
    assert proc.returncode == 0, proc.stderr
    assert differences(out, upstream_gguf("dflash2-b8", outtype)) == []


def test_writes_provenance_beyond_upstream(fixtures, target_gguf, tmp_path):
    out = tmp_path / "ours.gguf"
    proc = dflash_gguf("convert", fixtures / "dflash-b16", "--target", fixtures / "target-hf", "-o", out,
                       "--license", "apache-2.0")
    assert proc.returncode == 0, proc.stderr
    with GGUFFile(out) as f:
        assert f.get("general.license") == "apache-2.0"
        assert f.get("general.base_model.count") == 1
        assert f.get("general.base_model.0.name") == "target-hf"


@pytest.mark.parametrize("drafter", ["dflash-b16", "dflash2-b8"])
def test_migrated_legacy_matches_upstream(drafter, fixtures, upstream_gguf, tmp_path):
    legacy = make_legacy(upstream_gguf(drafter, "f16"), tmp_path / "legacy.gguf")
    with GGUFFile(legacy) as f:
        assert f.architecture == "dflash-draft" and "dflash_fc.weight" in f.tensors
    out = tmp_path / "migrated.gguf"
    proc = dflash_gguf("convert", legacy, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert differences(out, upstream_gguf(drafter, "f16")) == []


@pytest.mark.parametrize("outtype", ["f16", "q8_0"])
def test_target_converter_matches_upstream(outtype, fixtures, tmp_path):
    from training.fixtures.target_model import convert_target
    from training.fixtures.upstream import run_upstream_converter

    ours = convert_target(fixtures / "target-hf", tmp_path / "ours.gguf", outtype)
    theirs = run_upstream_converter(fixtures / "target-hf", tmp_path / "theirs.gguf", outtype)
    assert differences(ours, theirs) == []
