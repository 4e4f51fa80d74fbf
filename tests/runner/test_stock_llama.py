"""Stock llama.cpp conformance: every drafter family the converter writes, run in stock llama.cpp
(PyPI xllamacpp, the `test-stock` extra; training/fixtures/xllamacpp_server.py) beside the patched build, with
the one launch recipe (runner/launch.py) on the same prompts.

Where dflash_gguf/gguf/llama_support.py says stock runs a file, stock must load it, draft, stay lossless (the
target alone's tokens) and draft and accept exactly what the patched build does; where it says a
patch is needed, stock must refuse the file with the reason the table gives. So the table the model
card and `inspect` read is what this test measured, and it fails the day stock behaves otherwise.
Without the extra the tests skip, saying what to install.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_gguf.gguf.describe import describe
from dflash_gguf.gguf.llama_support import FEATURES, STOCK_MEASURED, VARIANT_SUPPORT, support_of
from dflash_gguf.errors import ServerStartError
from tests.conftest import dflash_gguf
from tests.refusal import assert_refused
from tests.fixtures.published_drafters import cached_published
from tests.runner.test_patches import misfit_drafters  # noqa: F401  (a fixture)
from training.fixtures.xllamacpp_server import Run, run_prompts

# family -> (where its GGUF comes from, the table's feature it exercises or None for the plain variant)
FAMILIES = {
    "dflash": ("trained", None),
    "dflash2": ("trained", None),
    "dspark": ("trained", None),
    "sinks": ("published", "attention-sinks"),
    "mask-embedding": ("published", "mask-embedding"),
    "dspark-eagle3": ("published", "reduced-vocabulary"),
    "gpt-oss-bias": ("published", "attention-bias"),
}
TRAINED_PROMPTS, TRAINED_TOKENS = 3, 48  # the trained pair drafts and accepts: counts worth comparing
TINY_PROMPTS = ["The capital of France is"]
TINY_TOKENS = 8


@pytest.fixture(scope="module")
def stock_bin(tmp_path_factory) -> Path:
    xllamacpp = pytest.importorskip("xllamacpp", reason="needs the test-stock extra: pip install -e '.[test-stock]'")
    assert f"xllamacpp=={xllamacpp.__version__}" == STOCK_MEASURED  # the build the table was measured on
    from training.fixtures.xllamacpp_server import shim_folder

    return shim_folder(tmp_path_factory.mktemp("stock-bin"))


@pytest.fixture(scope="module")
def family_models(trained_pair, target_gguf, tmp_path_factory) -> dict[str, tuple[Path, Path, list[str], int]]:
    """family -> (target, drafter GGUF, prompts, tokens)."""
    prompts = trained_pair["prompts"].read_text().splitlines()[:TRAINED_PROMPTS]
    prompts = [p.replace("\\n", "\n").replace("\\\\", "\\") for p in prompts]
    published = cached_published()
    work = tmp_path_factory.mktemp("families")
    out = {}
    for family, (source, _) in FAMILIES.items():
        if source == "trained":
            out[family] = (trained_pair["target"], trained_pair[family], prompts, TRAINED_TOKENS)
            continue
        gguf = work / f"{family}.gguf"
        proc = dflash_gguf("convert", published / family, "--target", target_gguf, "-o", gguf)
        assert proc.returncode == 0, proc.stderr
        out[family] = (target_gguf, gguf, TINY_PROMPTS, TINY_TOKENS)
    return out


_ALONE: dict[tuple, Run] = {}


def _alone(llama_bin: Path, target: Path, prompts: list[str], n: int, tmp_path: Path) -> Run:
    """The target alone in the patched build: what lossless means (one run per target and prompts)."""
    key = (target, tuple(prompts), n)
    if key not in _ALONE:
        _ALONE[key] = run_prompts(llama_bin, target, None, prompts, n, tmp_path / "alone.log")
    return _ALONE[key]


@pytest.mark.integration
@pytest.mark.parametrize("family", list(FAMILIES))
def test_stock_llama_cpp_runs_what_the_table_says(family, stock_bin, family_models, llama_bin, tmp_path):
    target, draft, prompts, n = family_models[family]
    desc = describe(draft)
    runs_on = support_of(desc)
    feature = FAMILIES[family][1]
    assert ([f.key for f in runs_on.features] == [feature]) if feature else runs_on.features == ()

    alone = _alone(llama_bin, target, prompts, n, tmp_path)
    patched = run_prompts(llama_bin, target, draft, prompts, n, tmp_path / "patched.log")
    assert patched.tokens == alone.tokens and patched.drafted > 0  # the patched build runs every family

    if runs_on.stock:
        assert runs_on.text == f"stock llama.cpp with {VARIANT_SUPPORT[desc.variant]} support"
        stock = run_prompts(stock_bin, target, draft, prompts, n, tmp_path / "stock.log")
        assert stock.tokens == alone.tokens  # lossless
        assert (stock.drafted, stock.accepted) == (patched.drafted, patched.accepted)
        if FAMILIES[family][0] == "trained":
            assert stock.accepted > 0
    else:
        with pytest.raises(ServerStartError) as refused:
            run_prompts(stock_bin, target, draft, prompts, n, tmp_path / "stock.log")
        for f in runs_on.patches:
            assert f.stock_refusal in str(refused.value)
            assert f.patch_label in runs_on.text


def test_every_row_of_the_table_is_measured_and_documented():
    assert {f.key for f in FEATURES} == {feature for _, feature in FAMILIES.values() if feature}
    docs = (Path(__file__).parents[2] / "docs" / "llama.md").read_text()
    for f in FEATURES:  # docs/llama.md's table says what this one does
        assert f.name in docs and (f.patch or "| stock |") in docs and (f.stock_refusal or "") in docs, f.key
    assert STOCK_MEASURED in docs


@pytest.mark.integration
def test_a_misfit_drafter_aborts_stock_and_is_refused_by_the_patched_build(stock_bin, misfit_drafters,  # noqa: F811
                                                                          target_gguf, llama_bin, tmp_path):
    """Stock llama.cpp aborts on a drafter wider than its target (GGML_ASSERT, SIGABRT): in a process of
    its own the abort is observed; the patched build (0001) refuses it with one line."""
    draft = misfit_drafters["wide-128"]
    with pytest.raises(ServerStartError) as stock:
        run_prompts(stock_bin, target_gguf, draft, TINY_PROMPTS, 4, tmp_path / "stock.log")
    assert stock.value.returncode in (-6, 134), stock.value
    assert "GGML_ASSERT" in str(stock.value)
    with pytest.raises(ServerStartError) as patched:
        run_prompts(llama_bin, target_gguf, draft, TINY_PROMPTS, 4, tmp_path / "patched.log")
    assert "dflash: draft embedding length 128 != target 64" in str(patched.value)


# -- validate --llama-bin: a user's own build ---------------------------------------------------------

@pytest.mark.integration
def test_validate_with_a_users_own_build(llama_bin, trained_pair, tmp_path):
    """`validate --llama-bin DIR` runs the build in DIR (here a copy of the patched build's bin folder,
    laid out as a user's cmake build) for both servers and the teacher-forced check, and says so."""
    import json
    import shutil

    own = shutil.copytree(llama_bin, tmp_path / "llama.cpp" / "build" / "bin", symlinks=True)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(trained_pair["prompts"].read_text().splitlines(keepends=True)[:2]))
    report = tmp_path / "report.json"
    proc = dflash_gguf("validate", "-t", trained_pair["target"], "-d", trained_pair["dflash2"], "--prompts", prompts,
                       "-n", "16", "--llama-bin", own, "--threads", "1", "--report", report)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(report.read_text())
    assert r["exact"] and r["llama"]["bin"] == str(own)
    assert r["launch"]["speculative_command"][0] == str(own / "llama-server")
    assert r["launch"]["target_command"][0] == str(own / "llama-server")


def test_validate_with_a_folder_that_is_no_build(fixtures, target_gguf, tmp_path):
    draft = tmp_path / "draft.gguf"
    assert dflash_gguf("convert", fixtures / "dflash-b16", "-t", target_gguf, "-o", draft).returncode == 0
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello\n")
    proc = dflash_gguf("validate", "-t", target_gguf, "-d", draft, "--prompts", prompts, "--llama-bin", tmp_path)
    assert_refused(proc, f"{tmp_path / 'llama-server'}: not found", "--llama-bin")


# -- what the card, inspect and release say (no llama.cpp needed) --------------------------------------

def test_the_table_words_each_case():
    from dflash_gguf.gguf.llama_support import support

    assert support("dflash2", ["fc.weight", "selector_hidden.weight"]).text == "stock llama.cpp with DFlash 2 support"
    assert support("dspark", ["d2t", "markov_w1.weight"]).text == "stock llama.cpp with DSpark support"
    bias = support("dflash", ["fc.weight", "blk.0.attn_q.bias", "blk.0.attn_sinks.weight"])
    assert not bias.stock and [f.key for f in bias.features] == ["attention-sinks", "attention-bias"]
    assert bias.text == "needs a build with dflash-gguf's attention-bias patch (0004)"
    assert bias.to_dict()["patches"] == ["0004-dflash-attention-bias.patch"]
    assert all((Path(__file__).parents[2] / "ggml_patches" / f.patch).is_file() for f in FEATURES if f.patch)


def test_release_warns_and_the_card_and_inspect_say_what_runs_it(fixtures, target_gguf, tmp_path):
    rel = tmp_path / "rel"
    proc = dflash_gguf("release", cached_published() / "gpt-oss-bias", "-t", target_gguf, "--types", "F16", "-o", rel,
                       "--license", "mit", "--target-license", "apache-2.0", "--skip-validate")
    assert proc.returncode == 0, proc.stderr
    assert "warning: stock llama.cpp cannot load these files: its attention biases make stock llama.cpp refuse it " \
           "(\"wrong number of tensors\")" in proc.stderr
    card = (rel / "README.md").read_text()
    assert "**This file needs a build with dflash-gguf's attention-bias patch (0004)**" in card
    assert f"PyPI `{STOCK_MEASURED}`" in card
    (gguf,) = rel.glob("*.gguf")
    assert "  runs on         needs a build with dflash-gguf's attention-bias patch (0004)" in \
        dflash_gguf("inspect", gguf).stdout

    draft = tmp_path / "plain.gguf"
    assert dflash_gguf("convert", fixtures / "dflash-b16", "-t", target_gguf, "-o", draft).returncode == 0
    assert "  runs on         stock llama.cpp with DFlash support" in dflash_gguf("inspect", draft).stdout
