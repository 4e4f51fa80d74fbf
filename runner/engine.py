"""llama-cpp-python on the patched libllama, for in-process work (metadata, tokens, target logits).

`make setup` installs llama-cpp-python without compiling its own llama.cpp
(`CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"`); `LLAMA_CPP_LIB_PATH` points it at the
patched build's libllama, so the Python side and `llama-server` share one engine.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import LlamaBuildError
from . import build


def use_patched_library(backend: str | None = None) -> Path:
    """Point llama-cpp-python at the patched build; must run before `import llama_cpp`."""
    bin_dir = build.find_build(backend)
    if bin_dir is None:
        raise LlamaBuildError("no patched llama.cpp build for this checkout: run `dflash-gguf llama build` first")
    current = os.environ.get("LLAMA_CPP_LIB_PATH")
    if current and Path(current) != bin_dir:
        raise LlamaBuildError(f"LLAMA_CPP_LIB_PATH is already {current}; unset it to use the patched build {bin_dir}")
    os.environ["LLAMA_CPP_LIB_PATH"] = str(bin_dir)
    return bin_dir


def load_model(path: str | Path, *, backend: str | None = None, **kwargs):
    """A `llama_cpp.Llama` on the patched libllama (quiet unless `verbose=True` is given)."""
    use_patched_library(backend)
    try:
        import llama_cpp
    except ImportError:
        raise LlamaBuildError("llama-cpp-python is not installed: run `make setup`") from None
    kwargs.setdefault("verbose", False)
    return llama_cpp.Llama(str(path), **kwargs)
