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

from dflash_gguf.gguf import layout
from dflash_gguf.gguf.checkpoint import DrafterCheckpoint


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


# -- raw file surgery, for what no writer would produce ------------------------------------------------

def write_config(folder: Path, config) -> Path:
    """Replace config.json with any JSON value (or raw text)."""
    path = folder / "config.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return folder


def deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


def rewrite_safetensors_header(path: Path, edit) -> Path:
    """Apply `edit(header dict)` to a safetensors header, keeping the data bytes."""
    import struct

    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    new = edit(header)
    raw = new if isinstance(new, bytes) else (new if isinstance(new, str) else json.dumps(new)).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])
    return path


def sparse_checkpoint(folder: Path, intermediate_size: int) -> Path:
    """Give a drafter folder a wider FFN with all-zero bf16 weights stored sparse (fast to make, slow
    to convert): a conversion long enough to be interrupted."""
    import struct

    edit_config(folder, intermediate_size=intermediate_size)
    ckpt = DrafterCheckpoint(folder)
    header, offset = {}, 0
    for rule, bid in layout.expected_tensors(ckpt.variant, ckpt.n_layers):
        shape = rule.shape(ckpt.geometry())
        nbytes = int(np.prod(shape)) * 2
        header[rule.hf_name(bid)] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    for p in folder.glob("*.safetensors"):
        p.unlink()
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path = folder / "model.safetensors"
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + offset)
    return folder


def rebuild_gguf(src: Path, out: Path, kv=None, tensors=None, alignment: int = 32, version: int = 3,
                 data_cut: int | None = None) -> Path:
    """Write `src` again with its metadata entries and tensor infos edited as raw records.

    kv(list of (key, encoded type+value bytes)) -> list; tensors(list of [name, dims (GGUF order),
    type, offset]) -> list. Data bytes are copied as they were (cut to `data_cut` when given).
    """
    import struct

    from dflash_gguf.gguf.reader import GGUFFile

    with GGUFFile(src) as f:
        kvs = [(k, v.encoded()) for k, v in f.kv.items()]
        infos = [[t.name, list(reversed(t.shape)), int(t.type), t.offset] for t in f.tensors.values()]
        data = bytes(f._map[f.data_offset:])
    kvs = kv(kvs) if kv else kvs
    infos = tensors(infos) if tensors else infos
    body = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(infos), len(kvs)))
    for key, encoded in kvs:
        k = key.encode()
        body += struct.pack("<Q", len(k)) + k + encoded
    for name, dims, ttype, offset in infos:
        n = name.encode()
        body += struct.pack("<Q", len(n)) + n + struct.pack("<I", len(dims)) + b"".join(
            struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ttype, offset)
    body += b"\0" * (-len(body) % alignment)
    Path(out).write_bytes(bytes(body) + data[:data_cut])
    return Path(out)


def encode(vtype, value, sub_type=None) -> bytes:
    """A metadata value as its type tag and bytes."""
    from dflash_gguf.gguf.format import KV

    return KV("", vtype, value, sub_type).encoded()


def nested_array(depth: int) -> bytes:
    """An array of arrays `depth` deep, as type tag and bytes."""
    import struct

    from gguf import GGUFValueType as T

    inner = struct.pack("<IQ", T.INT32, 1) + struct.pack("<i", 0)
    for _ in range(depth):
        inner = struct.pack("<IQ", T.ARRAY, 1) + inner
    return struct.pack("<I", T.ARRAY) + inner
