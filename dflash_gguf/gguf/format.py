"""The GGUF format as the reader (reader.py) and the writer (writer.py) both spell it: the magic, the
alignment, how each scalar value type is packed, a metadata entry, a tensor info, and a span of
bytes the writer copies from a file (a tensor of a GGUF or a safetensors file)."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# struct formats of the scalar value types
SCALAR = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.FLOAT64: "<d",
    GGUFValueType.BOOL: "<?",
}


@dataclass(frozen=True)
class FileSpan:
    """Bytes to copy verbatim from a file: the writer hands these to the kernel (copy_file_range).
    `source`: the file as it was opened and checked (confine.Opened); the bytes come from it, never
    from whatever `path` names by the time they are copied."""

    path: Path
    offset: int
    nbytes: int
    source: Any = field(default=None, compare=False, repr=False)


@dataclass
class KV:
    """One metadata entry: its decoded value and, when read from a file, its exact bytes."""

    key: str
    type: GGUFValueType
    value: Any
    sub_type: GGUFValueType | None = None
    raw: bytes | None = None  # the serialized type+value, as read

    def encoded(self) -> bytes:
        """Type tag and value, as they go after the key."""
        if self.raw is not None:
            return self.raw
        return struct.pack("<I", self.type) + _pack_value(self.value, self.type, self.sub_type)


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy / PyTorch order (outermost first)
    type: GGMLQuantizationType
    offset: int = 0  # relative to the start of the data section

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        block, type_size = GGML_QUANT_SIZES[self.type]
        return self.n_elements // block * type_size


def _pack_value(value: Any, vtype: GGUFValueType, sub_type: GGUFValueType | None) -> bytes:
    if vtype in SCALAR:
        return struct.pack(SCALAR[vtype], value)
    if vtype == GGUFValueType.STRING:
        data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        return struct.pack("<Q", len(data)) + data
    if vtype == GGUFValueType.ARRAY:
        if sub_type is None:
            sub_type = GGUFValueType.get_type(value[0])
        items = b"".join(_pack_value(v, sub_type, None) for v in value)
        return struct.pack("<IQ", sub_type, len(value)) + items
    raise ValueError(f"unsupported GGUF value type {vtype!r}")
