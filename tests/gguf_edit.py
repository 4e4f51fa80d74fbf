"""Copies of GGUF files with one tensor changed, for runs that must differ on purpose."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from dflash_gguf.gguf.file import KV, GGUFFile, GGUFPlan, PlannedTensor, TensorInfo, write_gguf


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


def edited_copy(src: Path, dst: Path, *, set_kv: tuple[KV, ...] = (), drop: tuple[str, ...] = (),
                rename_prefix: tuple[str, str] | None = None, drop_tensors: tuple[str, ...] = ()) -> Path:
    """`src` with metadata changed: entries set (added or replaced), dropped, or a key prefix renamed
    (e.g. ("qwen3.", "qwen2.") with general.architecture set to qwen2); tensors copied as they are,
    but for those whose name ends with one of `drop_tensors`."""
    with GGUFFile(src) as f:
        plan = GGUFPlan()
        for key, kv in f.kv.items():
            if key in drop:
                continue
            if rename_prefix and key.startswith(rename_prefix[0]):
                kv = KV(rename_prefix[1] + key[len(rename_prefix[0]):], kv.type, kv.value, kv.sub_type, kv.raw)
            plan.add_kv([kv])
        plan.add_kv(list(set_kv))
        for name, info in f.tensors.items():
            if name.endswith(drop_tensors) and drop_tensors:
                continue
            data = bytes(f.tensor_bytes(name))
            plan.tensors.append(PlannedTensor(TensorInfo(name, info.shape, info.type), lambda data=data: [data]))
        write_gguf(plan, dst)
    return dst
