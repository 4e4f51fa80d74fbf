"""A defensive, streaming safetensors reader: sizes and offsets are checked before they are trusted,
and tensor data is read in row chunks with `pread`, so memory stays bounded whatever the model size."""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..confined_reader import Opened
from ..errors import CheckpointError, InputError
from ..inputs import parse_json
from ..terminal import shown
from .format import FileSpan

# safetensors dtype -> (numpy dtype used to read it, bytes per element)
DTYPES = {
    "F32": (np.dtype("<f4"), 4),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2),  # read as raw bits; see `to_float32`
    "F64": (np.dtype("<f8"), 8),
    "I64": (np.dtype("<i8"), 8),
    "I32": (np.dtype("<i4"), 4),
    "F8_E4M3": (np.dtype("u1"), 1),  # raw codes; only FP8 exports have them (see quantized.py)
    "BOOL": (np.dtype("u1"), 1),  # masks some exports carry (DSpark t2d), never written
}

MAX_HEADER = 100 * 1024 * 1024
MAX_TENSORS = 1 << 16  # tensors in one file: a drafter has a few hundred; each costs work before it is refused
MAX_NAME = 512         # characters of a tensor name


@dataclass(frozen=True)
class StoredTensor:
    file: Path
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int
    source: Any = field(default=None, compare=False, repr=False)  # the file as opened (confine.Opened)

    @property
    def row_bytes(self) -> int:
        """Bytes per row of the last dimension (the unit chunks are cut in)."""
        return (self.shape[-1] if self.shape else 1) * DTYPES[self.dtype][1]


def read_header(source: Opened) -> dict[str, StoredTensor]:
    """Parse and validate one safetensors file's header, from the file as it was opened. Raises
    CheckpointError on anything off."""
    path, size = source.path, source.size
    try:
        head = source.pread(8, 0)
        if len(head) < 8:
            raise CheckpointError(f"{shown(path)}: {size} bytes is too short for safetensors (truncated?)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise CheckpointError(
                f"{shown(path)}: header length {n} does not fit in the file ({size} bytes): truncated or corrupt")
        raw = source.pread(n, 8)
    except OSError as err:
        raise CheckpointError(f"{shown(path)}: cannot read ({err.strerror})") from None
    try:
        header = parse_json(raw, f"{path}: safetensors header")
    except InputError as err:
        raise CheckpointError(f"{err}: corrupt file") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{shown(path)}: safetensors header is not a JSON object: corrupt file")
    if len(header) > MAX_TENSORS + 1:
        raise CheckpointError(f"{shown(path)}: {len(header)} tensors in one file, more than the {MAX_TENSORS} a "
                              "drafter checkpoint could hold: corrupt or not a drafter")
    data_start = 8 + n
    tensors: dict[str, StoredTensor] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if len(name) > MAX_NAME or not name.isprintable():
            raise CheckpointError(f"{shown(path)}: tensor name {shown(repr(name)[:80])} is not a tensor name "
                                  "(too long or with control characters): corrupt file")
        try:
            dtype, shape, (begin, end) = meta["dtype"], tuple(meta["shape"]), meta["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: tensor {name!r} has a malformed header entry: corrupt file") from None
        if not all(_is_count(v) for v in (*shape, begin, end)):
            raise CheckpointError(f"{path}: tensor {name!r} has a shape or data_offsets that are not whole numbers "
                                  f"(shape {meta['shape']!r}, data_offsets {meta['data_offsets']!r}): corrupt file")
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise CheckpointError(f"{shown(path)}: tensor {name!r} has dtype {shown(repr(dtype)[:40])}, which this "
                                  "converter does not read")
        expected = math.prod(shape) * DTYPES[dtype][1]
        if not (0 <= begin <= end) or end - begin != expected:
            raise CheckpointError(
                f"{path}: tensor {name!r} offsets {begin}..{end} do not match its shape {list(shape)} "
                f"and dtype {dtype}: corrupt file")
        if data_start + end > size:
            raise CheckpointError(
                f"{path}: tensor {name!r} ends at byte {data_start + end} but the file has {size} bytes: "
                "truncated download? fetch the file again")
        if len(shape) > 8:
            raise CheckpointError(f"{shown(path)}: tensor {name!r} has {len(shape)} dimensions: corrupt file")
        tensors[name] = StoredTensor(path, name, dtype, shape, data_start + begin, expected, source)
    spans = sorted((t.start, t.start + t.nbytes, t.name) for t in tensors.values() if t.nbytes)
    for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
        if start < end:
            raise CheckpointError(f"{path}: tensors {first!r} and {second!r} share bytes (overlapping "
                                  "data_offsets): corrupt file")
    return tensors


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def to_float32(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32, copy=False)


def iter_row_chunks(t: StoredTensor, max_bytes: int = 16 << 20) -> Iterator[np.ndarray]:
    """Yield the tensor as consecutive blocks of whole rows (raw dtype, shape [rows, last_dim])."""
    np_dtype, width = DTYPES[t.dtype]
    row = t.row_bytes
    n_rows = t.nbytes // row if row else 0
    rows_per_chunk = max(1, max_bytes // max(row, 1))
    fd = t.source.fileno()
    for first in range(0, n_rows, rows_per_chunk):
        count = min(rows_per_chunk, n_rows - first)
        want = count * row
        buf = os.pread(fd, want, t.start + first * row)
        if len(buf) != want:
            raise CheckpointError(f"{shown(t.file)}: tensor {t.name!r} is cut short: truncated file")
        yield np.frombuffer(buf, dtype=np_dtype).reshape(count, row // width)


def iter_spans(t: StoredTensor, rewrite: Callable[[np.ndarray], bool] | None = None,
               max_bytes: int = 16 << 20) -> Iterator[FileSpan | np.ndarray]:
    """Walk the tensor in spans of whole rows. Each span is yielded as a FileSpan to copy verbatim,
    or, when `rewrite(values)` says so, as a copy of its raw values. Values are looked at through a
    short-lived mapping: no copy, and memory bounded by one span."""
    np_dtype, width = DTYPES[t.dtype]
    row = max(t.row_bytes, 1)
    step = max(1, max_bytes // row) * row
    page = mmap.ALLOCATIONGRANULARITY
    fd = t.source.fileno()  # the file as opened and checked (confine.Opened), never reopened by name
    for start in range(0, t.nbytes, step):
        length = min(step, t.nbytes - start)
        offset = t.start + start
        if rewrite is None:
            yield FileSpan(t.file, offset, length, t.source)
            continue
        base = offset - offset % page
        try:
            mapped = mmap.mmap(fd, length + offset - base, access=mmap.ACCESS_READ, offset=base)
        except ValueError:
            raise CheckpointError(f"{t.file}: tensor {t.name!r} is cut short: truncated file") from None
        values = np.frombuffer(mapped, dtype=np_dtype, count=length // width, offset=offset - base)
        chunk = values.copy() if rewrite(values) else FileSpan(t.file, offset, length, t.source)
        del values
        mapped.close()
        yield chunk
