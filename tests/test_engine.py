"""Which libllama the in-process bindings load (runner/bindings.py)."""

from __future__ import annotations

import os
import sys
import types

import pytest

from dflash_gguf.errors import LlamaBuildError
from dflash_gguf.runner import bindings as engine


def test_an_inherited_lib_path_is_replaced_before_the_bindings_load(monkeypatch, tmp_path):
    """A variable left by a parent process (or another step) must not stop a run on another build."""
    monkeypatch.delitem(sys.modules, "llama_cpp", raising=False)
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(tmp_path / "elsewhere"))
    assert engine.use_patched_library(bin_dir=tmp_path / "build") == tmp_path / "build"
    assert os.environ["LLAMA_CPP_LIB_PATH"] == str(tmp_path / "build")


def test_a_loaded_library_is_not_switched_silently(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "llama_cpp", types.ModuleType("llama_cpp"))
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(tmp_path / "first"))
    assert engine.use_patched_library(bin_dir=tmp_path / "first") == tmp_path / "first"
    with pytest.raises(LlamaBuildError, match="already loaded libllama from .*first.*new process"):
        engine.use_patched_library(bin_dir=tmp_path / "second")
