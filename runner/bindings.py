"""llama-cpp-python's bindings on the patched libllama, for in-process work (metadata, tokens, logits).

The bindings are the pure-Python `llama_cpp` package of the same pinned sdist the patched build
comes from (no separate install, no compile, no version skew between the bindings and the
library); `LLAMA_CPP_LIB_PATH` points them at the patched build's libllama, so the Python side
and `llama-server` share one engine.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

from dflash_gguf.errors import LlamaBuildError
from . import build, sdist


def use_patched_library(backend: str | None = None, bin_dir: Path | None = None) -> Path:
    """Point the bindings at the build in `bin_dir` (default: the patched build for `backend`);
    must run before `import llama_cpp`."""
    bin_dir = Path(bin_dir) if bin_dir is not None else build.find_bin_dir(backend)
    # The bindings read LLAMA_CPP_LIB_PATH once, when they load: before that the variable (a user's,
    # or one inherited from a parent process) is ours to set; after, this process has its libllama.
    if "llama_cpp" in sys.modules:
        current = os.environ.get("LLAMA_CPP_LIB_PATH")
        if current is None or Path(current).resolve() != bin_dir.resolve():
            raise LlamaBuildError(f"this process already loaded libllama from {current or 'elsewhere'}; "
                                  f"run the step on {bin_dir} in a new process")
        return bin_dir
    os.environ["LLAMA_CPP_LIB_PATH"] = str(bin_dir)
    return bin_dir


def bindings():
    """The `llama_cpp` module of the pinned sdist, loaded against the patched libllama."""
    root = sdist.bindings_root()
    loaded = sys.modules.get("llama_cpp")
    if loaded is not None:
        origin = Path(getattr(loaded, "__file__", "") or "").resolve()
        if root.resolve() not in origin.parents:
            raise LlamaBuildError(f"another llama_cpp is already loaded from {origin}; "
                                  "run this in a process that has not imported it")
        return loaded
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    _cxx_runtime_first()
    try:
        # after: LLAMA_CPP_LIB_PATH names the patched library (the bindings load it when imported)
        import llama_cpp
    except ImportError as err:
        raise LlamaBuildError(f"the llama-cpp-python bindings in {root} do not import ({err}); "
                              "reinstall dflash-gguf to get their dependencies") from None
    return llama_cpp


def _cxx_runtime_first() -> None:
    """Put the C++ runtime in the process's global symbol scope before libllama loads, as it is in
    llama-server (whose executable links it). The libraries carry weak copies of the standard
    library's templates, and in a Python process, where nothing global defines them, libllama's
    references bind to the first library of its own load order that has one: on a CUDA build that
    was libggml-cuda's copy of `std::ostream::_M_insert<long>`, and every model load segfaulted in
    `llama_model::print_info` (H200, CUDA 13.0, GCC 13: docs/benchmarks-cuda.md)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
        except OSError:  # a libc++ toolchain: its runtime comes with libllama, as before
            pass


_QUIET_LOG = []


def quiet_logs(lib) -> None:
    """Drop llama.cpp's log messages in this process. The callback lives as long as the process:
    llama.cpp keeps the pointer after its owner is gone, and one freed with a Replay or a Teacher
    crashed the next model load in the same process (a segfault in llama_model_load_from_file)."""
    if not _QUIET_LOG:
        _QUIET_LOG.append(lib.llama_log_callback(lambda level, text, user: None))
    lib.llama_log_set(_QUIET_LOG[0], ctypes.c_void_p(0))


def load_model(path: str | Path, *, backend: str | None = None, bin_dir: Path | None = None, **kwargs):
    """A `llama_cpp.Llama` on the patched libllama (quiet unless `verbose=True` is given)."""
    use_patched_library(backend, bin_dir)
    kwargs.setdefault("verbose", False)
    return bindings().Llama(str(path), **kwargs)


class HeldModel:
    """Holds a model and its context on the low-level bindings (`_lib`, `_model`, `_ctx`, loaded by
    the subclass's `__enter__`); leaving the `with` block frees the context, then the model."""

    _lib = _model = _ctx = None

    def __exit__(self, *exc_info) -> None:
        if self._ctx:
            self._lib.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            self._lib.llama_model_free(self._model)
            self._model = None
