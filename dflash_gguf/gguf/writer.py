"""A streaming GGUF writer: everything a file will hold is planned first (GGUFPlan), then written in
the format's order (header, key/values, tensor infos, aligned tensor data) through a temporary file
renamed into place only when complete. Tensor data streams in chunks, or is copied in the kernel from
the file it was checked in (FileSpan), so memory stays bounded by one chunk."""

from __future__ import annotations

import contextlib
import os
import struct
from dataclasses import dataclass, field
from enum import Enum, auto
from pathlib import Path
from typing import Any, BinaryIO

from gguf import GGUFValueType, GGUFWriter

from ..outputs import guard, named_for, partial_name
from ..secrets import refuse_secrets
from .format import DEFAULT_ALIGNMENT, KV, MAGIC, FileSpan, TensorInfo

VERSION = 3


def kv_from_writer(writer: GGUFWriter) -> list[KV]:
    """The metadata a gguf-py writer collected, as KV entries (types exactly as gguf-py chose them)."""
    return [KV(key, v.type, v.value, v.sub_type) for key, v in writer.kv_data[0].items()]


class _State(Enum):
    COLLECTING = auto()
    WRITING_DATA = auto()
    DONE = auto()


@dataclass
class PlannedTensor:
    info: TensorInfo
    chunks: Any  # () -> Iterable[bytes-like | FileSpan]: the tensor's data, in order, info.nbytes long


@dataclass
class GGUFPlan:
    """Everything a GGUF will contain, before a byte is written."""

    kv: list[KV] = field(default_factory=list)
    tensors: list[PlannedTensor] = field(default_factory=list)

    def add_kv(self, items: list[KV]) -> None:
        """Add entries; a key already present is replaced where it stands."""
        index = {kv.key: i for i, kv in enumerate(self.kv)}
        for kv in items:
            if kv.key in index:
                self.kv[index[kv.key]] = kv
            else:
                index[kv.key] = len(self.kv)
                self.kv.append(kv)


def write_gguf(plan: GGUFPlan, out: Path, progress=None) -> None:
    """Write `plan` to `out` through a temporary file renamed into place only when complete.

    `progress(done_bytes, total_bytes, tensor_name)` is called as data is written.
    """
    out = Path(out)
    tmp = partial_name(out)
    refuse_secrets((kv.value for kv in plan.kv if kv.type == GGUFValueType.STRING), out)
    try:
        guard(out)
        with open(tmp, "wb") as fh:
            _GGUFStreamWriter(fh).write(plan, progress)
        guard(out)
        os.replace(tmp, out)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.filename in (None, str(tmp)):
            raise named_for(err, out) from None
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def encode_header(plan: GGUFPlan, alignment: int = DEFAULT_ALIGNMENT) -> bytes:
    """Header, key/values and tensor infos, padded to where tensor data starts; sets each tensor's
    offset in the data section."""
    out = [MAGIC + struct.pack("<IQQ", VERSION, len(plan.tensors), len(plan.kv))]
    for kv in plan.kv:
        key = kv.key.encode("utf-8")
        out.append(struct.pack("<Q", len(key)) + key + kv.encoded())
    offset = 0
    for t in plan.tensors:
        t.info.offset = offset
        name = t.info.name.encode("utf-8")
        dims = tuple(reversed(t.info.shape))
        out.append(struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims))
                   + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", t.info.type, offset))
        offset += -(-t.info.nbytes // alignment) * alignment
    size = sum(map(len, out))
    return b"".join(out) + b"\0" * (-size % alignment)


class _GGUFStreamWriter:
    def __init__(self, fh: BinaryIO, alignment: int = DEFAULT_ALIGNMENT):
        self.fh = fh
        self.alignment = alignment
        self.state = _State.COLLECTING

    def _pad(self, n: int) -> None:
        pad = -n % self.alignment
        if pad:
            self.fh.write(b"\0" * pad)

    def write(self, plan: GGUFPlan, progress=None) -> None:
        if self.state is not _State.COLLECTING:
            raise RuntimeError("GGUF writer already used")
        fh = self.fh
        fh.write(encode_header(plan, self.alignment))
        self.state = _State.WRITING_DATA
        total = sum(t.info.nbytes for t in plan.tensors)
        done = 0
        for t in plan.tensors:
            written = 0
            for chunk in t.chunks():
                if isinstance(chunk, FileSpan):
                    n = self._copy_span(chunk)
                else:
                    fh.write(chunk)
                    n = memoryview(chunk).nbytes
                written += n
                done += n
                if progress:
                    progress(done, total, t.info.name)
            if written != t.info.nbytes:
                raise RuntimeError(f"tensor {t.info.name}: wrote {written} bytes, expected {t.info.nbytes}")
            self._pad(written)
        self.state = _State.DONE

    def _copy_span(self, span: FileSpan) -> int:
        """Copy file bytes in the kernel where it can (copy_file_range), else through a buffer."""
        self.fh.flush()
        out_fd = self.fh.fileno()
        held = getattr(span.source, "fh", span.source)  # a confine.Opened, or an open file
        with contextlib.nullcontext(held) if held is not None else open(span.path, "rb") as src:
            offset, left = span.offset, span.nbytes
            while left:
                try:
                    n = os.copy_file_range(src.fileno(), out_fd, left, offset)
                except (AttributeError, OSError):
                    n = os.write(out_fd, os.pread(src.fileno(), min(left, 16 << 20), offset))
                if n == 0:
                    raise OSError(f"{span.path}: unexpected end of file at byte {offset}")
                offset += n
                left -= n
        self.fh.seek(0, os.SEEK_END)
        return span.nbytes
