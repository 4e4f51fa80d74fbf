"""`dflash-gguf quantize`: recipes, the types actually written, refusals, no partial output.

Tests marked `integration` run llama-quantize from the patched build (conftest's `llama_bin` finds
it in the cache or builds it; DFLASH_GGUF_TEST_LLAMA_BIN=DIR runs another build's). The others fake
llama-quantize with a shell script, or stop before it runs.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as QT

from dflash_gguf.convert.converter import convert
from dflash_gguf.gguf.reader import GGUFFile
from dflash_gguf.quantize import quantize as q
from tests.conftest import dflash_gguf
from tests.refusal import assert_refused

KEPT_TYPES = {"fc.weight", "selector_hidden.weight", "selector_predecessor.weight", "selector_successor.weight",
              "blk.0.attn_conv_proj.weight", "blk.0.ffn_conv_proj.weight",
              "blk.1.attn_conv_proj.weight", "blk.1.ffn_conv_proj.weight"}


@pytest.fixture(scope="session")
def drafter_f16(fixtures: Path, target_gguf: Path, tmp_path_factory):
    """drafter_f16(name, license=None): a fixture drafter converted to F16 (cached per session)."""
    folder = tmp_path_factory.mktemp("f16")
    made: dict[tuple[str, str | None], Path] = {}

    def get(name: str, license_id: str | None = None) -> Path:
        if (name, license_id) not in made:
            out = folder / f"{name}-{license_id or 'none'}-F16.gguf"
            convert(fixtures / name, target_gguf, out, "f16", license_id)
            made[name, license_id] = out
        return made[name, license_id]

    return get


def _types(path: Path) -> dict[str, QT]:
    with GGUFFile(path) as f:
        return {name: t.type for name, t in f.tensors.items()}


def _run(*args):
    return dflash_gguf("quantize", *args)


# -- the recipe table, without llama.cpp ----------------------------------------------------------

def test_recipe_arguments_for_llama_quantize():
    keep = q.llama_quantize_args("Q4_K_M", q.RECIPES["keep-fc"])
    assert keep == ["--tensor-type", r"^fc\.weight$=q8_0", "--tensor-type", "^selector_=q8_0",
                    "--tensor-type", "_conv_=q8_0"]
    assert q.llama_quantize_args("Q4_K_M", q.RECIPES["keep-fc-f16"])[1].endswith("=f16")
    assert q.llama_quantize_args("Q4_K_M", q.RECIPES["plain"]) == []
    assert q.llama_quantize_args("F16", q.RECIPES["keep-fc"]) == []  # overrides only apply to quantized types


@pytest.mark.parametrize("name, kept", [
    ("fc.weight", True), ("selector_hidden.weight", True), ("selector_predecessor.weight", True),
    ("blk.3.attn_conv_proj.weight", True), ("blk.0.ffn_conv_proj.weight", True),
    ("blk.0.ffn_up.weight", False), ("enc.output_norm.weight", False), ("blk.0.attn_q.weight", False),
])
def test_kept_tensors(name, kept):
    assert q.is_kept(name) is kept


def test_expected_types():
    keep = q.RECIPES["keep-fc"]
    assert q.expected_type("blk.0.attn_norm.weight", (64,), QT.F32, "Q4_K_M", keep) == QT.F32
    assert q.expected_type("blk.0.attn_conv_base", (2, 2, 64), QT.F32, "Q4_K_M", keep) == QT.F32
    assert q.expected_type("fc.weight", (64, 256), QT.F16, "Q4_K_M", keep) == QT.Q8_0
    # rows of 8 values do not fill a 32-value Q8_0 block: llama-quantize writes F16
    assert q.expected_type("selector_successor.weight", (151936, 8), QT.F16, "Q4_K_M", keep) == QT.F16
    assert q.expected_type("blk.0.ffn_up.weight", (128, 64), QT.F16, "Q4_K_M", keep) is None  # the mixture decides
    assert q.expected_type("blk.0.ffn_up.weight", (128, 64), QT.F16, "F32", keep) == QT.F32


def test_parse_fallbacks():
    log = ("warning: blk.0.attn_k.weight                  - ncols     64 not divisible by 256 (required for type"
           "    q4_K) -> falling back to    q5_0\n"
           "warning: selector_predecessor.weight          - ncols      8 not divisible by  32 (required for type"
           "    q8_0) (WARNING: must use F16 due to unusual shape) -> falling back to     f16\n")
    assert q.parse_fallbacks(log) == [
        {"tensor": "blk.0.attn_k.weight", "row": 64, "wanted": "Q4_K", "used": "Q5_0"},
        {"tensor": "selector_predecessor.weight", "row": 8, "wanted": "Q8_0", "used": "F16"},
    ]


def test_unknown_type_is_one_line_exit_2(drafter_f16, tmp_path):
    proc = _run(drafter_f16("dflash-b16"), tmp_path / "o.gguf", "--type", "Q9_9", "--llama-bin", tmp_path)
    assert_refused(proc, "Q9_9", "Q4_K_M")


def test_missing_llama_quantize_is_named(drafter_f16, tmp_path):
    proc = _run(drafter_f16("dflash-b16"), tmp_path / "o.gguf", "--type", "Q8_0", "--llama-bin", tmp_path)
    assert_refused(proc, "llama-quantize: not found")
    assert not (tmp_path / "o.gguf").exists()


# llama-quantize [options] IN OUT TYPE THREADS, faked as a copy of IN to OUT
_COPY_INPUT = 'n=$#; eval src=\\${$((n-3))}; eval dst=\\${$((n-2))}; cp "$src" "$dst"\n'


def _fake_llama_quantize(folder: Path, script: str) -> Path:
    folder.mkdir()
    exe = folder / "llama-quantize"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return folder


def test_a_failing_llama_quantize_leaves_nothing(drafter_f16, tmp_path):
    fake = _fake_llama_quantize(tmp_path / "bin", 'echo "main: error: boom" >&2\nexit 1\n')
    out = tmp_path / "out" / "o.gguf"
    out.parent.mkdir()
    proc = _run(drafter_f16("dflash-b16"), out, "--type", "Q8_0", "--llama-bin", fake)
    assert_refused(proc, "llama-quantize failed", "main: error: boom")
    assert list(out.parent.iterdir()) == []


def test_output_that_breaks_the_recipe_is_refused_and_removed(drafter_f16, tmp_path):
    # a "llama-quantize" that copies its input: kept tensors stay F16 where keep-fc promises Q8_0
    fake = _fake_llama_quantize(tmp_path / "bin", _COPY_INPUT)
    out = tmp_path / "out" / "o.gguf"
    out.parent.mkdir()
    proc = _run(drafter_f16("dflash-b16"), out, "--type", "Q4_K_M", "--recipe", "keep-fc", "--llama-bin", fake)
    assert_refused(proc, "fc.weight is F16, recipe keep-fc says Q8_0")
    assert list(out.parent.iterdir()) == []


def test_no_derivatives_input_is_refused(drafter_f16, tmp_path):
    fake = _fake_llama_quantize(tmp_path / "bin", _COPY_INPUT)  # never reached
    out = tmp_path / "o.gguf"
    proc = _run(drafter_f16("dflash-b16", "cc-by-nc-nd-4.0"), out, "--type", "Q8_0", "--llama-bin", fake)
    assert_refused(proc, "NoDerivatives", "cc-by-nc-nd-4.0")
    assert not out.exists() and list(tmp_path.glob(".*partial")) == []


def test_existing_output_needs_force(drafter_f16, tmp_path):
    out = tmp_path / "o.gguf"
    out.write_bytes(b"keep me")
    proc = _run(drafter_f16("dflash-b16"), out, "--type", "Q8_0", "--llama-bin", tmp_path)
    assert_refused(proc, "--force")
    assert out.read_bytes() == b"keep me"


# -- through the real llama-quantize ------------------------------------------------------------

@pytest.mark.integration
def test_keep_fc_keeps_fc_selector_and_conv_at_q8_0(drafter_f16, llama_bin, tmp_path):
    src = drafter_f16("dflash2-b8")
    out = tmp_path / "q4.gguf"
    proc = _run(src, out, "--type", "Q4_K_M", "--recipe", "keep-fc", "--llama-bin", llama_bin, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    written = _types(out)
    # the report says what the file holds
    assert {t["name"]: t["type"] for t in report["tensors"]} == {n: t.name for n, t in written.items()}
    for name in KEPT_TYPES:
        # the selector codebooks have rows of 8 values (selector_rank): too short for any block, F16
        want = QT.F16 if name.startswith(("selector_predecessor", "selector_successor")) else QT.Q8_0
        assert written[name] == want, name
    assert written["blk.0.attn_conv_base"] == QT.F32 and written["output_norm.weight"] == QT.F32
    # rows of 64 values do not fill a 256-value K-quant block: llama-quantize fell back, and we say so
    assert written["blk.0.attn_q.weight"] not in (QT.Q4_K, QT.F16)
    assert "blk.0.attn_q.weight" in report["off_type"]
    assert any(f["tensor"] == "blk.0.attn_q.weight" and f["wanted"] == "Q4_K" for f in report["fallbacks"])
    assert report["types"] == {k: v for k, v in sorted(
        {t.name: list(written.values()).count(t) for t in set(written.values())}.items())}


@pytest.mark.integration
def test_recipes_differ_where_they_say(drafter_f16, llama_bin, tmp_path):
    src = drafter_f16("dflash2-b8")
    got = {}
    for recipe in ("plain", "keep-fc", "keep-fc-f16"):
        out = tmp_path / f"{recipe}.gguf"
        q.quantize(src, out, "Q4_K_M", recipe, llama_bin)
        got[recipe] = _types(out)
    # fc.weight has rows of 256 values, so plain Q4_K_M really quantizes it to Q4_K
    assert got["plain"]["fc.weight"] == QT.Q4_K
    assert got["keep-fc"]["fc.weight"] == QT.Q8_0
    assert got["keep-fc-f16"]["fc.weight"] == QT.F16
    assert got["keep-fc-f16"]["selector_hidden.weight"] == QT.F16
    assert got["keep-fc"]["blk.1.ffn_up.weight"] == got["plain"]["blk.1.ffn_up.weight"]


@pytest.mark.integration
def test_q8_0_quantizes_every_matrix_and_keeps_the_metadata(drafter_f16, llama_bin, tmp_path):
    src = drafter_f16("dflash-swa", "apache-2.0")
    out = tmp_path / "q8.gguf"
    proc = _run(src, out, "--type", "q8_0", "--llama-bin", llama_bin)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out}" in proc.stdout and "as Q8_0 with recipe plain" in proc.stdout
    with GGUFFile(src) as a, GGUFFile(out) as b:
        for name, t in a.tensors.items():
            want = QT.F32 if t.type == QT.F32 else QT.Q8_0
            assert b.tensors[name].type == want, name
        for key, kv in a.kv.items():
            if key != "general.file_type":
                assert b.get(key) == kv.value, key
        assert b.get("general.license") == "apache-2.0"
        assert b.get("dflash.attention.sliding_window_pattern") == a.get("dflash.attention.sliding_window_pattern")


@pytest.mark.integration
def test_quantized_input_is_refused(drafter_f16, llama_bin, tmp_path):
    q8 = tmp_path / "q8.gguf"
    q.quantize(drafter_f16("dflash-b16"), q8, "Q8_0", "plain", llama_bin)
    proc = _run(q8, tmp_path / "q4.gguf", "--type", "Q4_0", "--llama-bin", llama_bin)
    assert_refused(proc, "already holds quantized tensors (Q8_0)")
    assert not (tmp_path / "q4.gguf").exists()


def test_outer_dimensions_of_one_do_not_count_in_shapes():
    assert q._ggml_shape((1, 288)) == q._ggml_shape((288,)) == (288,)
    assert q._ggml_shape((1, 1)) == (1,)
    assert q._ggml_shape((2, 288)) != q._ggml_shape((288,))
    assert q._ggml_shape((288, 1)) != q._ggml_shape((288,))  # an inner 1 is a real dimension


@pytest.mark.integration
def test_dspark_drafter_quantizes_and_drafts(trained_pair, llama_bin, tmp_path):
    """DSpark's conf_proj is [1, 288] in the converted GGUF and comes back from llama-quantize as
    [288] (ggml drops outer dimensions of 1): the same tensor, not a broken recipe."""
    from dflash_gguf.runner.server import LlamaServer

    out = tmp_path / "dspark-Q8_0.gguf"
    proc = _run(trained_pair["dspark"], out, "--type", "Q8_0", "--llama-bin", llama_bin)
    assert proc.returncode == 0, proc.stderr
    with GGUFFile(trained_pair["dspark"]) as a, GGUFFile(out) as b:
        assert a.tensors["conf_proj.weight"].shape == (1, 288) and b.tensors["conf_proj.weight"].shape == (288,)
    args = ["-md", out, "--spec-type", "draft-dspark", "--parallel", "1", "-c", "512", "-t", "1"]
    with LlamaServer(trained_pair["target"], args, bin_dir=llama_bin, log_path=tmp_path / "server.log") as server:
        answer = server.client.complete("import os\nimport sys\n", 32, ignore_eos=True)
    assert answer.n_predicted == 32 and answer.draft_n_accepted > 0
