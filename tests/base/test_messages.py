"""Error messages name what the user gave and what to do (issue 14, class 9): the output, never the
hidden temporary file; a swapped target and drafter as swapped; llama-quantize's own reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_gguf.quantize.quantize import failure_reason
from tests.conftest import cli
from tests.refusal import assert_refused


def test_an_unwritable_output_is_named_not_its_temporary_file(fixtures, target_gguf):
    out = Path("/proc/dflash-gguf-test-output.gguf")  # a folder nobody, root included, may create files in
    line = assert_refused(cli("convert", fixtures / "dflash-b16", "--target", target_gguf, "-o", out))
    assert str(out) in line and ".partial" not in line, line


def test_swapped_target_and_drafter_say_so(converted, target_gguf, fixtures, tmp_path):
    drafter = converted["dflash-b16"]
    line = assert_refused(cli("convert", fixtures / "dflash-b16", "--target", drafter, "-o", tmp_path / "x.gguf"))
    assert "drafter" in line and "swapped" in line and "deeper" not in line, line
    line = assert_refused(cli("validate", "--target", drafter, "--draft", target_gguf, "--backend", "metal"))
    assert "target" in line and ("swapped" in line or "drafter goes second" in line), line


def test_convert_to_an_existing_folder_says_it_is_a_folder(fixtures, target_gguf, tmp_path):
    line = assert_refused(cli("convert", fixtures / "dflash-b16", "--target", target_gguf, "-o", tmp_path))
    assert "is a folder" in line and "--force" not in line, line


@pytest.mark.parametrize("output, reason", [
    ("llama_quantize: quantizing 'x' to 'y' as Q8_0\n"
     "gguf_init_from_file_impl: alignment 7 is not a power of 2\n"
     "gguf_init_from_file_impl: failed to read key-value pairs\n"
     "llama_model_quantize: failed to quantize: llama_model_loader: failed to load model from x\n"
     "llama_quantize: failed to quantize model from 'x'\n",
     "gguf_init_from_file_impl: alignment 7 is not a power of 2"),
    ("llama_quantize: failed to quantize model from 'x'\n", "llama_quantize: failed to quantize model from 'x'"),
    ("", "no output"),
])
def test_llama_quantize_failure_quotes_its_reason(output, reason):
    assert failure_reason(output) == reason
