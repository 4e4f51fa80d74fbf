"""cuBLAS and the driver library for a CUDA build, where the toolkit does not carry them.

ggml-cuda links cuBLAS and (for its virtual-memory pool) the driver library `libcuda`. A full
CUDA toolkit has both (the driver as a link stub); a toolkit assembled from NVIDIA's PyPI wheels
(`nvidia-cuda-nvcc`, `nvidia-cuda-runtime`, ...) has neither, and CMake then stops with
"Target ggml-cuda links to: CUDA::cublas but the target was not found". cuBLAS also comes as a
wheel (`nvidia-cublas` for CUDA 13, `nvidia-cublas-cu12` for CUDA 12); this module finds it in
the running Python's site-packages and hands its files to CMake. Without a driver library,
nothing can run on this machine anyway: the build turns ggml's VMM pool off so it links.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from dflash_gguf.errors import LlamaBuildError


@dataclass(frozen=True)
class Toolkit:
    root: Path
    major: int

    def lib_dirs(self) -> list[Path]:
        return [self.root / "lib64", self.root / "lib", *sorted((self.root / "targets").glob("*/lib"))]

    def has_library(self, name: str) -> bool:
        return any(any(d.glob(f"lib{name}.so*")) or any((d / "stubs").glob(f"lib{name}.so*"))
                   for d in self.lib_dirs())


def find_toolkit() -> Toolkit | None:
    """The toolkit of the `nvcc` on PATH (what CMake's FindCUDAToolkit picks too)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"release (\d+)\.", out)
    if not found:
        return None
    return Toolkit(root=Path(nvcc).resolve().parent.parent, major=int(found.group(1)))


def wheel_cublas(major: int, search: list[str] | None = None) -> tuple[Path, Path] | None:
    """(include dir, lib dir) of a cuBLAS wheel for CUDA `major` installed in this Python."""
    layouts = [f"nvidia/cu{major}", "nvidia/cublas"]  # CUDA 13 wheels, then CUDA 12's
    for entry in search if search is not None else sys.path:
        for layout in layouts:
            base = Path(entry) / layout
            if (base / "include" / "cublas_v2.h").is_file() and any((base / "lib").glob(f"libcublas.so.{major}*")):
                return base / "include", base / "lib"
    return None


def cmake_flags(toolkit: Toolkit | None, search: list[str] | None = None) -> list[str]:
    """Extra `-D` flags a CUDA build needs on this machine; [] for a complete toolkit."""
    if toolkit is None:
        raise LlamaBuildError("the cuda backend needs the CUDA toolkit: no `nvcc` on PATH "
                              "(install the CUDA toolkit, or set PATH to include its bin folder)")
    flags: list[str] = []
    if not toolkit.has_library("cublas"):
        wheel = wheel_cublas(toolkit.major, search)
        if wheel is None:
            package = "nvidia-cublas" if toolkit.major >= 13 else f"nvidia-cublas-cu{toolkit.major}"
            raise LlamaBuildError(
                f"the CUDA {toolkit.major} toolkit at {toolkit.root} has no cuBLAS (libcublas), which ggml-cuda "
                f"links: install the toolkit's cuBLAS, or `pip install '{package}=={toolkit.major}.*'` into "
                "this environment")
        include, lib = wheel
        # the wheel's folder is on no search path: the linker needs it to resolve libggml-cuda's own
        # dependencies when linking the programs, and they need it at run time
        flags += [f"-DCUDA_cublas_LIBRARY={_one(lib, 'cublas', toolkit.major)}",
                  f"-DCUDA_cublasLt_LIBRARY={_one(lib, 'cublasLt', toolkit.major)}",
                  f"-DCMAKE_CUDA_FLAGS=-isystem {include}",
                  f"-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,{lib} -Wl,-rpath,{lib}",
                  f"-DCMAKE_SHARED_LINKER_FLAGS=-Wl,-rpath,{lib}"]
    if not toolkit.has_library("cuda"):
        flags.append("-DGGML_CUDA_NO_VMM=ON")
    return flags


def _one(lib: Path, name: str, major: int) -> Path:
    found = sorted(lib.glob(f"lib{name}.so.{major}*"))
    if not found:
        raise LlamaBuildError(f"{lib}: no lib{name}.so.{major} in the cuBLAS wheel; reinstall it")
    return found[0]
