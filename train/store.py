"""The teacher's answers on disk: written in shards as they come (a killed run keeps every finished
shard), then laid out once as flat arrays that training memory-maps, so that what the process holds
stays bounded by the page cache whatever the number of prompts.

    shard-00000.npz ...     one per group of conversations (ids, prompt lengths, taps, top-k)
    ids.i32 taps.f16 top_ids.i32 top_logp.f16   [rows, width(, n)] padded arrays, memory-mapped
    store.json              their shapes, written last: the store is complete when it exists
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .recipe import DistillSet
from .teacher import Answer

ARRAYS = {"ids": np.int32, "taps": np.float16, "top_ids": np.int32, "top_logp": np.float16}


def shard_path(folder: Path, index: int) -> Path:
    return folder / f"shard-{index:05d}.npz"


def write_shard(folder: Path, index: int, answers: Sequence[Answer]) -> None:
    arrays = {"lengths": np.array([len(a.ids) for a in answers]),
              "prompt_lengths": np.array([a.prompt_len for a in answers]),
              "ids": np.concatenate([a.ids for a in answers]).astype(np.int32),
              "taps": np.concatenate([a.taps for a in answers]),
              "top_ids": np.concatenate([a.top_ids for a in answers]),
              "top_logp": np.concatenate([a.top_logp for a in answers])}
    out = shard_path(folder, index)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, out)


def merge(folder: Path, shards: int, seconds: float) -> dict:
    """Lay the shards out as padded, memory-mappable arrays (one shard in memory at a time);
    `seconds`, what making them took, is recorded for the runs that reuse the store."""
    lengths, prompt_lengths, widths = [], [], {}
    for i in range(shards):
        with np.load(shard_path(folder, i)) as shard:
            lengths += shard["lengths"].tolist()
            prompt_lengths += shard["prompt_lengths"].tolist()
            widths = {name: shard[name].shape[1:] for name in ("taps", "top_ids")}
    rows, width = len(lengths), max(lengths)
    shapes = {"ids": (rows, width), "taps": (rows, width - 1, *widths["taps"]),
              "top_ids": (rows, width - 1, *widths["top_ids"]), "top_logp": (rows, width - 1, *widths["top_ids"])}
    out = {name: np.lib.format.open_memmap(folder / f"{name}.npy", mode="w+", dtype=ARRAYS[name], shape=shape)
           for name, shape in shapes.items()}
    row = 0
    for i in range(shards):
        with np.load(shard_path(folder, i)) as shard:
            ends = np.cumsum(shard["lengths"])
            fed_ends = np.cumsum(shard["lengths"] - 1)
            for n, length in enumerate(shard["lengths"]):
                out["ids"][row, :length] = shard["ids"][ends[n] - length: ends[n]]
                for name in ("taps", "top_ids", "top_logp"):
                    out[name][row, :length - 1] = shard[name][fed_ends[n] - (length - 1): fed_ends[n]]
                row += 1
    for array in out.values():
        array.flush()
    info = {"rows": rows, "width": width, "lengths": lengths, "prompt_lengths": prompt_lengths,
            "seconds": round(seconds, 1),
            "bytes": sum(os.path.getsize(folder / f"{name}.npy") for name in ARRAYS)}
    tmp = folder / ".store.json.partial"
    tmp.write_text(json.dumps(info), encoding="utf-8")
    os.replace(tmp, folder / "store.json")
    for i in range(shards):
        shard_path(folder, i).unlink()
    return info


def info(folder: Path) -> dict | None:
    path = folder / "store.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def distill_set(folder: Path, mask_token_id: int) -> DistillSet:
    """The store as the recipe reads it, memory-mapped (copy-on-write: nothing is written back)."""
    meta = info(folder)
    arrays = {name: torch.from_numpy(np.load(folder / f"{name}.npy", mmap_mode="c")) for name in ARRAYS}
    lengths, prompt_lengths = torch.tensor(meta["lengths"]), torch.tensor(meta["prompt_lengths"])
    return DistillSet(ids=arrays["ids"].long(), feats=arrays["taps"], valid_end=lengths,
                      first_anchor=prompt_lengths - 1, mask_token_id=mask_token_id,
                      teacher_ids=arrays["top_ids"], teacher_logp=arrays["top_logp"])
