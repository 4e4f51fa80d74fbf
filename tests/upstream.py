"""The pinned upstream converter (`convert_hf_to_gguf.py` from the llama-cpp-python 0.3.36 sdist),
and the tiny target GGUF it makes, cached beside the fixtures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dflash_gguf.runner.sdist import upstream_converter
from tests.fixtures.tiny_models import cached_fixtures


def run_upstream_converter(src: Path, out: Path, outtype: str, target_dir: Path | None = None,
                           extra: tuple[str, ...] = ()) -> Path:
    script, gguf_py = upstream_converter()
    cmd = [sys.executable, str(script), str(src), "--outfile", str(out), "--outtype", outtype, *extra]
    if target_dir is not None:
        cmd += ["--target-model-dir", str(target_dir)]
    proc = subprocess.run(cmd, cwd=script.parent, env={**os.environ, "PYTHONPATH": str(gguf_py)},
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"upstream converter failed on {src}:\n{proc.stderr[-3000:]}")
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
