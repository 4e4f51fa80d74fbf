"""The target-family zoo (tests/fixtures/families.py), family by family: the pinned upstream converter
writes each tiny target with its family's architecture and the keys its drafters depend on;
dflash-gguf converts the family's DFlash and DFlash 2 drafters against it with the published
geometry; the patched llama-server serves each pair losslessly."""

from __future__ import annotations

import json

import pytest

from dflash_gguf.convert.gguf_file import GGUFFile
from dflash_gguf.convert.keys import DFlash
from dflash_gguf.families import FAMILIES
from tests.conftest import dflash_gguf
from tests.fixtures.family_drafters import VARIANTS, geometry

ARCHS = sorted(FAMILIES)


@pytest.mark.upstream
@pytest.mark.parametrize("arch", ARCHS)
def test_target_carries_its_family_geometry(arch, family):
    fam = FAMILIES[arch]
    with GGUFFile(family(arch) / "target-F16.gguf") as target:
        assert target.architecture == arch
        assert target.get(f"{arch}.block_count") == fam.num_layers
        assert target.get(f"{arch}.embedding_length") == fam.toy["hidden_size"]
        missing = [key for key in fam.target_keys if target.get(f"{arch}.{key}") is None]
    assert not missing, f"{arch} target lacks {missing}"


@pytest.mark.upstream
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("arch", ARCHS)
def test_drafter_converts_with_published_geometry(arch, variant, family):
    folder = family(arch)
    status = json.loads((folder / "status.json").read_text())
    assert status[variant] == "converted", status[variant]
    fam, geo = FAMILIES[arch], geometry(FAMILIES[arch], variant)
    with GGUFFile(folder / f"{variant}.gguf") as drafter:
        assert drafter.get(DFlash.BLOCK_SIZE) == geo.block_size
        assert list(drafter.get(DFlash.TARGET_LAYERS)) == [i + 1 for i in fam.tapped_layers(geo.num_layers)]
        assert (drafter.get(DFlash.CONV_KERNEL_SIZE) is not None) == (variant == "dflash2")


@pytest.mark.integration
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("arch", ARCHS)
def test_pair_is_exact_in_patched_server(arch, variant, family, llama_bin, tmp_path):
    """Under --exact the speculative output is the target's own and no token is a mismatch. Where
    llama-server rolls rejected drafts back through checkpoints (recurrent and sliding-window
    targets), validate does not yet replay those steps, so only the others must be fully proven."""
    folder = family(arch)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join((folder / "prompts.txt").read_text().splitlines(keepends=True)[:2]))
    report = tmp_path / "report.json"
    proc = dflash_gguf("validate", "--target", folder / "target-F16.gguf", "--draft", folder / f"{variant}.gguf",
                       "--prompts", prompts, "-n", "24", "--backend", "cpu", "--threads", "1", "--exact",
                       "--report", report)
    assert report.is_file(), proc.stderr[-2000:]
    result = json.loads(report.read_text())
    assert result["exact"], result["prompts"]
    assert not [d for d in result["divergences"] if d["kind"] == "mismatch"], result["divergences"]
    fam = FAMILIES[arch]
    if not (fam.recurrent or fam.sliding):
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert result["positions_checked"] == result["produced"]
