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


@pytest.mark.integration
def test_a_model_loads_after_a_replay_is_gone(trained_pair, llama_bin):
    """llama.cpp keeps the log callback it is given after its owner is gone: the Replay's own callback,
    freed with it, crashed the next in-process model load (a segfault in llama_model_load_from_file:
    stop 41's CI, tests/house/test_benchmark_rows.py then tests/validation/test_teacher_forcing.py in one worker). Run
    in a process of its own, so a crash is an exit status this test reads."""
    import subprocess

    script = (
        "import gc, sys\n"
        "from dflash_gguf.runner.bindings import load_model\n"
        "from dflash_gguf.validation.replay import Replay, ServerContext\n"
        "target, bin_dir = sys.argv[1], sys.argv[2]\n"
        "with Replay(target, ServerContext(n_ctx=64), bin_dir=bin_dir):\n"
        "    pass\n"
        "gc.collect()\n"
        "load_model(target, bin_dir=bin_dir, n_ctx=64).close()\n"
        "print('loaded')\n")
    proc = subprocess.run([sys.executable, "-c", script, str(trained_pair["target"]), str(llama_bin)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "loaded", proc.stderr[-2000:]


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the dynamic linker's global scope: Linux")
def test_the_cxx_runtime_is_global_before_libllama_loads(llama_bin):
    """In a Python process nothing global defines the C++ runtime's template instances, and libllama's
    references bound to a weak copy in libggml-cuda (a segfault in every in-process model load on the
    first GPU run, docs/speed.md). Once the bindings are loaded, `std::ostream::_M_insert<long>`
    must resolve in the global scope, to libstdc++ itself. In a process of its own: the test's
    interpreter may already hold what it checks."""
    import subprocess

    script = (
        "import ctypes, sys\n"
        "from dflash_gguf.runner import bindings\n"
        "bindings.use_patched_library(bin_dir=sys.argv[1])\n"
        "bindings.bindings()\n"
        "class Info(ctypes.Structure):\n"
        "    _fields_ = [('fname', ctypes.c_char_p), ('fbase', ctypes.c_void_p), ('sname', ctypes.c_char_p),"
        " ('saddr', ctypes.c_void_p)]\n"
        "dl = ctypes.CDLL(None)\n"
        "dl.dlsym.restype = ctypes.c_void_p\n"
        "dl.dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]\n"
        "addr = dl.dlsym(None, b'_ZNSo9_M_insertIlEERSoT_')\n"
        "info = Info()\n"
        "found = addr and dl.dladdr(ctypes.c_void_p(addr), ctypes.byref(info))\n"
        "print(info.fname.decode() if found else 'unresolved')\n")
    proc = subprocess.run([sys.executable, "-c", script, str(llama_bin)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "libstdc++" in proc.stdout, proc.stdout
