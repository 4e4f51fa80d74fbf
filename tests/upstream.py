"""The pinned upstream converter (`convert_hf_to_gguf.py` from the llama-cpp-python 0.3.36 sdist),
and the tiny target GGUF it makes, cached beside the fixtures.

Its outputs are kept in `<cache>/fixtures/upstream/`, keyed by every byte of its inputs, the
converter's own files and the library versions it reads with: the converter is deterministic, so a
second run of the suite converts nothing again. A conversion that does run is forked from a warm
process per test worker that has imported torch, transformers and the converter's modules once
(6 of the 11-15 s each conversion spent starting; 59 conversions in a run from an empty cache)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from importlib import metadata
from pathlib import Path

from dflash_gguf.hashing import hash_files, sha256_file
from dflash_gguf.paths import cache_dir
from dflash_gguf.runner.sdist import upstream_converter
from tests.fixtures.tiny_models import cached_fixtures
from tests.warm import WarmProcess

CACHE_FORMAT = 1  # bump when what a cached output depends on changes

# The warm process (tests/warm.py) has imported what every conversion imports; each conversion is a
# child forked from it. Forking before torch has run anything is safe: its thread pools start on first
# use, in the child.
_PREAMBLE = """
import os, runpy, sys
script, gguf_py = {script!r}, {gguf_py!r}
sys.path[:0] = [gguf_py, os.path.dirname(script)]
import torch, transformers, gguf, conversion  # noqa: F401
def run():
    runpy.run_path(script, run_name="__main__")
"""
_warm: dict[Path, WarmProcess] = {}  # one per converter tree: each imports its own `conversion`

# What the converter reads from the pinned tree (its modules, gguf-py, the chat templates it embeds)
CONVERTER_PATHS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "models/templates/")


def patched_converter() -> tuple[Path, Path]:
    """(convert_hf_to_gguf.py, gguf-py) of the pinned tree with the patches of ggml_patches/series
    that touch the converter applied (0011: Nemotron-H and DeepSeek-V4 as transformers saves them),
    laid out once under the cache, keyed by those patches."""
    import tempfile

    from dflash_gguf.runner import build, sdist

    def converter_file(rel: str) -> bool:
        return rel.startswith(CONVERTER_PATHS[1:]) or rel == CONVERTER_PATHS[0]

    patches = [p for p in build.read_series() if any(map(converter_file, build.patched_paths(p)))]
    key = hashlib.sha256(f"{sdist.SDIST_SHA256}\n{build.patches_hash(patches)}".encode()).hexdigest()[:16]
    folder = cache_dir() / "fixtures" / f"converter-{key}"
    if not (folder / CONVERTER_PATHS[0]).is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}-") as tmp:
            files = build.patched_file_map(sdist.pinned_tree(), patches, Path(tmp) / "patched")
            staging = Path(tmp) / "tree"
            for rel, src in files.items():
                if converter_file(rel):
                    (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, staging / rel)
            try:
                os.rename(staging, folder)
            except OSError:  # another worker laid it out first
                if not (folder / CONVERTER_PATHS[0]).is_file():
                    raise
    return folder / CONVERTER_PATHS[0], folder / "gguf-py"


def _convert(argv: list[str], log: Path, converter: tuple[Path, Path]) -> int:
    script, gguf_py = converter
    if script not in _warm:
        _warm[script] = WarmProcess(_PREAMBLE.format(script=str(script), gguf_py=str(gguf_py)))
    env = {**os.environ, "PYTHONPATH": str(gguf_py)}
    return _warm[script].run([str(script), *argv], env=env, cwd=script.parent, stdout=log, stderr=log).returncode


def _key(script: Path, src: Path, target_dir: Path | None, outtype: str, extra: tuple[str, ...]) -> str:
    def digest(folder: Path | None) -> dict[str, str] | None:
        if folder is None:
            return None
        return hash_files(folder, sorted(p for p in folder.rglob("*") if p.is_file()))

    record = {"format": CACHE_FORMAT, "converter": sha256_file(script), "tree": script.parent.name,
              "src": digest(Path(src)), "target": digest(target_dir), "outtype": outtype, "extra": list(extra),
              "versions": {name: metadata.version(name) for name in ("torch", "transformers", "safetensors")}}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:24]


def run_upstream_converter(src: Path, out: Path, outtype: str, target_dir: Path | None = None,
                           extra: tuple[str, ...] = (), converter: tuple[Path, Path] | None = None) -> Path:
    """`out`: what the pinned converter (or `converter`: patched_converter()) writes for `src` (a
    copy of the cached output)."""
    converter = converter or upstream_converter()
    script = converter[0]
    cached = cache_dir() / "fixtures" / "upstream" / f"{_key(script, src, target_dir, outtype, extra)}.gguf"
    if not cached.is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}.partial")
        log = tmp.with_suffix(".log")
        argv = [str(Path(src).resolve()), "--outfile", str(tmp.resolve()), "--outtype", outtype, *extra]
        if target_dir is not None:
            argv += ["--target-model-dir", str(Path(target_dir).resolve())]
        try:
            if _convert(argv, log, converter) != 0:
                raise RuntimeError(f"upstream converter failed on {src}:\n{log.read_text(errors='replace')[-3000:]}")
            os.replace(tmp, cached)
        finally:
            tmp.unlink(missing_ok=True)
            log.unlink(missing_ok=True)
    shutil.copyfile(cached, out)
    return out


def cached_target_gguf(outtype: str = "f16") -> Path:
    """The tiny target as a GGUF, converted once by the pinned upstream converter."""
    fixtures = cached_fixtures()
    out = fixtures.parent / f"{fixtures.name}-target-{outtype}.gguf"
    if not out.is_file():
        tmp = out.with_suffix(f".{os.getpid()}.partial")
        run_upstream_converter(fixtures / "target-hf", tmp, outtype)
        os.replace(tmp, out)
    return out


if __name__ == "__main__":
    print(cached_target_gguf(*sys.argv[1:2]))
