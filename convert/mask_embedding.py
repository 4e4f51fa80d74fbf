"""Drafters with their own mask embedding (`mask_embedding.pt` beside the weights, MiMo drafters).

The target's embedding row for the mask token is untrained there; the drafter brings its own
vector. As the pinned converter does, the GGUF then carries its own `token_embd.weight` (the
target's embeddings with the mask row replaced, in the target's precision) and `output.weight`
(the target's output head, unchanged), so llama.cpp uses them instead of the target's. The
embeddings come from the target given to `convert`: its GGUF (dequantized when quantized) or its
Hugging Face folder's safetensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from dflash_gguf.errors import CheckpointError, TargetError
from dflash_gguf.gguf import config_values as cv
from dflash_gguf.gguf.checkpoint import MASK_EMBEDDING_NAME, Checkpoint, DrafterCheckpoint
from dflash_gguf.gguf.reader import GGUFFile
from dflash_gguf.gguf.safetensors_file import StoredTensor, iter_row_chunks, to_float32
from dflash_gguf.gguf.torch_file import TorchTensor, load_torch_file

FILE_NAME = MASK_EMBEDDING_NAME
EMBEDDINGS, HEAD = "token_embd.weight", "output.weight"


class Rows(Protocol):
    name: str
    shape: tuple[int, ...]
    dtype: str

    def iter_rows(self) -> Iterator[np.ndarray]: ...


_GGUF_FLOATS = {QT.F32: ("F32", np.dtype("<f4")), QT.F16: ("F16", np.dtype("<f2")), QT.BF16: ("BF16", np.dtype("<u2"))}


@dataclass(frozen=True)
class GGUFRows:
    """A 2-D tensor of a GGUF, row by row: float types as stored, quantized ones dequantized to F32."""

    file: Path
    name: str
    shape: tuple[int, ...]
    qtype: QT

    @property
    def dtype(self) -> str:
        return _GGUF_FLOATS[self.qtype][0] if self.qtype in _GGUF_FLOATS else "F32"

    def iter_rows(self, rows_per_chunk: int = 4096) -> Iterator[np.ndarray]:
        n_rows = self.shape[0]
        with GGUFFile(self.file) as f:
            for first in range(0, n_rows, rows_per_chunk):
                count = min(rows_per_chunk, n_rows - first)
                raw = f.tensor_rows(self.name, first, count)
                if self.qtype in _GGUF_FLOATS:
                    yield raw.view(_GGUF_FLOATS[self.qtype][1]).reshape(count, -1)
                else:
                    try:
                        rows = gguf.quants.dequantize(raw, self.qtype)
                    except NotImplementedError:
                        raise TargetError(
                            f"{self.file}: {self.name} is {self.qtype.name}, which gguf-py cannot dequantize; "
                            "give a target GGUF with F16/BF16/Q8_0 embeddings or its HF folder") from None
                    yield rows.reshape(count, -1)


@dataclass(frozen=True)
class StoredRows:
    """A safetensors tensor, row by row, as stored."""

    stored: StoredTensor
    name: str

    @property
    def shape(self) -> tuple[int, ...]:
        return self.stored.shape

    @property
    def dtype(self) -> str:
        return self.stored.dtype

    def iter_rows(self) -> Iterator[np.ndarray]:
        return iter_row_chunks(self.stored)


@dataclass(frozen=True)
class PatchedRows:
    """Another tensor's rows with one row replaced."""

    source: Rows
    name: str
    row: int
    values: np.ndarray  # in the source's raw dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.source.shape

    @property
    def dtype(self) -> str:
        return self.source.dtype

    def iter_rows(self) -> Iterator[np.ndarray]:
        first = 0
        for chunk in self.source.iter_rows():
            if first <= self.row < first + len(chunk):
                chunk = chunk.copy()
                chunk[self.row - first] = self.values
            first += len(chunk)
            yield chunk


def _in_dtype(vector: TorchTensor, dtype: str) -> np.ndarray:
    """The mask vector cast to the embeddings' dtype (bf16 as bits), rounding to nearest even."""
    values = to_float32(vector.values, vector.dtype) if vector.dtype in ("BF16", "F32", "F16") \
        else vector.values.astype(np.float32)
    if dtype == "BF16":
        return gguf.quants.quantize(values.astype(np.float32), QT.BF16).view(np.uint16)
    return values.astype(np.float16 if dtype == "F16" else np.float32)


def read_mask_embedding(ckpt: DrafterCheckpoint) -> tuple[int, TorchTensor] | None:
    """(mask token id, vector) from the drafter's mask_embedding.pt, checked as upstream checks it."""
    opened = ckpt.mask_file
    if opened is None:
        return None
    path = opened.path
    data = load_torch_file(opened)
    if not isinstance(data, dict) or not isinstance(data.get("embedding"), TorchTensor) \
            or not isinstance(data["embedding"].values, np.ndarray):
        raise CheckpointError(f"{path}: expected a dict with 'mask_token_id' and an 'embedding' tensor")
    given = data.get("mask_token_id")
    if not isinstance(given, int) or isinstance(given, bool):
        raise CheckpointError(f"{path}: field 'mask_token_id' = {str(given)[:40]!r} is not an integer; "
                              "torch.save the mask token id as an int")
    if ckpt.mask_token_id is None or given != ckpt.mask_token_id:
        raise CheckpointError(
            f"{path}: mask_token_id {data.get('mask_token_id')!r} does not match config.json's "
            f"mask_token_id {ckpt.mask_token_id!r}; the two must name the same token")
    vector = data["embedding"]
    if vector.shape != (ckpt.hidden_size,):
        raise CheckpointError(
            f"{path}: embedding has shape {list(vector.shape)}, expected [{ckpt.hidden_size}] (hidden_size)")
    if not 0 <= ckpt.mask_token_id < ckpt.vocab_size:
        raise CheckpointError(f"{path}: mask_token_id {ckpt.mask_token_id} is outside the vocabulary")
    return ckpt.mask_token_id, vector


def _target_sources(target: Path) -> tuple[Rows, Rows]:
    """(embeddings, output head) of the target, from its GGUF or its HF folder's safetensors."""
    if target.is_file():
        with GGUFFile(target) as f:
            if EMBEDDINGS not in f.tensors:
                raise TargetError(f"{target}: no {EMBEDDINGS}; a drafter with {FILE_NAME} needs the target's embeddings")
            infos = {n: f.tensors[n] for n in (EMBEDDINGS, HEAD) if n in f.tensors}
        embd = GGUFRows(target, EMBEDDINGS, infos[EMBEDDINGS].shape, infos[EMBEDDINGS].type)
        head = infos.get(HEAD, infos[EMBEDDINGS])
        return embd, GGUFRows(target, head.name, head.shape, head.type)
    folder = Checkpoint(target)
    stored = folder.stored_tensors if any(folder.folder.glob("*.safetensors")) else {}
    config = {**folder.config, **folder.top("text_config", {})}
    embd_name = "model.embed_tokens.weight"
    tied = cv.read(folder.config_path, "tie_word_embeddings", config.get("tie_word_embeddings"), False, TargetError)
    head_name = embd_name if tied else "lm_head.weight"
    for name in (embd_name, head_name):
        if name not in stored:
            raise TargetError(
                f"{target}: no tensor {name!r} in its safetensors; a drafter with {FILE_NAME} takes the "
                "target's embeddings and output head: give the target folder with its weights, or its GGUF")
    return StoredRows(stored[embd_name], EMBEDDINGS), StoredRows(stored[head_name], HEAD)


def own_embeddings(ckpt: DrafterCheckpoint, target: Path) -> list[tuple[str, Rows, tuple[int, ...]]]:
    """The output head and the patched embeddings to write, in upstream's order; [] without a
    mask_embedding.pt."""
    mask = read_mask_embedding(ckpt)
    if mask is None:
        return []
    mask_id, vector = mask
    embd, head = _target_sources(Path(target))
    want = (ckpt.vocab_size, ckpt.hidden_size)
    for source in (embd, head):
        if tuple(source.shape) != want:
            raise TargetError(
                f"{target}: {source.name} has shape {list(source.shape)}, expected {list(want)} "
                "(the drafter's vocab_size x hidden_size); this drafter was made for another target")
    patched = PatchedRows(embd, EMBEDDINGS, mask_id, _in_dtype(vector, embd.dtype))
    return [(HEAD, head, want), (EMBEDDINGS, patched, want)]
