"""The pinned upstream converter (`convert_hf_to_gguf.py` from the llama-cpp-python 0.3.36 sdist),
and the tiny target GGUF it makes, cached beside the fixtures.

Its outputs are kept in `<cache>/fixtures/upstream/`, keyed by every byte of its inputs, the
converter's own files and the library versions it reads with: the converter is deterministic, so a
second run of the suite converts nothing again. A conversion that does run is forked from a warm
process per test worker that has imported torch, transformers and the converter's modules once
(6 of the 11-15 s each conversion spent starting; 59 conversions in a run from an empty cache)."""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from importlib import metadata
from pathlib import Path

from dflash_gguf.hashing import hash_files, sha256_file
from dflash_gguf.paths import cache_dir
from dflash_gguf.runner.sdist import upstream_converter
from tests.fixtures.tiny_models import cached_fixtures

CACHE_FORMAT = 1  # bump when what a cached output depends on changes

# The warm process: imports what every conversion imports, then forks one child per request (a line
# of JSON: argv, log path) and answers with the child's exit code. Forking before torch has run
# anything is safe: its thread pools start on first use, in the child.
_WARM = r"""
import json, os, runpy, sys, traceback
script, gguf_py = sys.argv[1], sys.argv[2]
sys.path[:0] = [gguf_py, os.path.dirname(script)]
os.chdir(os.path.dirname(script))
import torch, transformers, gguf, conversion  # noqa: F401
print("ready", flush=True)
for line in sys.stdin:
    argv, log = json.loads(line)
    pid = os.fork()
    if pid == 0:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1); os.dup2(fd, 2)
        sys.argv = [script, *argv]
        code = 0
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""

_warm: subprocess.Popen | None = None
_lock = threading.Lock()


def _warm_process() -> subprocess.Popen:
    global _warm
    if _warm is None or _warm.poll() is not None:
        script, gguf_py = upstream_converter()
        _warm = subprocess.Popen([sys.executable, "-c", _WARM, str(script), str(gguf_py)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(gguf_py)})
        atexit.register(_warm.kill)
        if _warm.stdout.readline().strip() != "ready":
            raise RuntimeError("the warm upstream converter process did not start")
    return _warm


def _convert(argv: list[str], log: Path) -> int:
    with _lock:
        warm = _warm_process()
        warm.stdin.write(json.dumps([argv, str(log)]) + "\n")
        warm.stdin.flush()
        return int(warm.stdout.readline())


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
                           extra: tuple[str, ...] = ()) -> Path:
    """`out`: what the pinned converter writes for `src` (a copy of the cached output)."""
    script, _ = upstream_converter()
    cached = cache_dir() / "fixtures" / "upstream" / f"{_key(script, src, target_dir, outtype, extra)}.gguf"
    if not cached.is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}.partial")
        log = tmp.with_suffix(".log")
        argv = [str(Path(src).resolve()), "--outfile", str(tmp.resolve()), "--outtype", outtype, *extra]
        if target_dir is not None:
            argv += ["--target-model-dir", str(Path(target_dir).resolve())]
        try:
            if _convert(argv, log) != 0:
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
