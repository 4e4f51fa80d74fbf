"""Copies of GGUF files with one tensor changed, for runs that must differ on purpose."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from dflash_gguf.convert.gguf_file import GGUFFile


def scaled_copy(src: Path, dst: Path, tensor: str, factor: float) -> Path:
    """`src` copied to `dst` with the F32 tensor `tensor` multiplied by `factor` (e.g. a target's
    output_norm.weight: its logits scale by the same factor, a temperature of 1/factor)."""
    with GGUFFile(src) as f:
        info = f.tensors[tensor]
        if info.type != GGMLQuantizationType.F32:
            raise ValueError(f"{src}: {tensor} is {info.type.name}, not F32")
        values = np.frombuffer(f.tensor_bytes(tensor), dtype=np.float32) * np.float32(factor)
        offset = f.data_offset + info.offset
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as fh:
        fh.seek(offset)
        fh.write(values.astype(np.float32).tobytes())
    return dst
