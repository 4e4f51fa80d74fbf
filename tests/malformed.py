"""Broken drafters and targets, made from the good fixtures: one function per way a user's input
goes wrong. Each returns the path to hand to `dflash-gguf convert`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save_file
from safetensors.torch import load_file, save_file as save_torch

from dflash_gguf.convert import layout
from dflash_gguf.convert.checkpoint import DrafterCheckpoint


def edit_config(folder: Path, **changes) -> Path:
    """Set top-level fields (or dflash_config fields with a `dflash__` prefix); None deletes."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        node, key = (config.setdefault("dflash_config", {}), key[len("dflash__"):]) if key.startswith("dflash__") else (config, key)
        if value is None:
            node.pop(key, None)
        else:
            node[key] = value
    path.write_text(json.dumps(config, indent=2))
    return folder


def edit_tensors(folder: Path, drop: tuple[str, ...] = (), add: dict[str, np.ndarray] | None = None) -> Path:
    path = folder / "model.safetensors"
    tensors = {k: v for k, v in load_file(path).items() if k not in drop}
    tensors.update({k: torch.from_numpy(v) for k, v in (add or {}).items()})
    save_torch(tensors, path)
    return folder


def regenerate_weights(folder: Path) -> Path:
    """Rewrite the weights with the shapes config.json now implies (for geometry changes)."""
    ckpt = DrafterCheckpoint(folder)
    geometry = ckpt.geometry()
    rng = np.random.default_rng(0)
    tensors = {rule.hf_name(bid): (rng.standard_normal(rule.shape(geometry)) * 0.02).astype(np.float16)
               for rule, bid in layout.expected_tensors(ckpt.variant, ckpt.n_layers)}
    for p in folder.glob("*.safetensors"):
        p.unlink()
    (folder / "model.safetensors.index.json").unlink(missing_ok=True)
    save_file(tensors, folder / "model.safetensors")
    return folder


def truncate(path: Path, keep_fraction: float = 0.5) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep_fraction)])
    return path


def copy_file(src: Path, dst_dir: Path) -> Path:
    dst = dst_dir / src.name
    shutil.copyfile(src, dst)
    return dst
