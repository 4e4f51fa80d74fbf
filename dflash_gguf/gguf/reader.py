"""A small, defensive GGUF reader.

It keeps each key/value's raw bytes, so tokenizer metadata can be copied verbatim from a target GGUF,
and checks every length and offset against the file size before trusting it (a truncated or corrupt
file raises GGUFFormatError naming what is wrong). Every GGUF the project opens is read here: a
drafter, a target (its metadata, and its tensors for training and for a drafter's own embeddings), a
remote file's header through range reads.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from .. import typed_reader as values
from ..errors import GGUFFormatError, InputError
from ..inputs import open_regular
from ..typed_reader import U32_MAX, Field
from .format import DEFAULT_ALIGNMENT, KV, MAGIC, SCALAR, FileSpan, TensorInfo
from .keys import General, Tokenizer

MAX_DIMS = 4            # GGML_MAX_DIMS
MAX_TENSOR_NAME = 64    # GGML_MAX_NAME, terminating zero included

# general.* keys read as text (names, licenses, links): declared STRING, valid UTF-8, no control characters
GENERAL_STRINGS = (General.ARCHITECTURE, General.NAME, General.LICENSE, General.LICENSE_NAME, General.LICENSE_LINK,
                   General.REPO_URL, General.SOURCE_REPO_URL, General.SOURCE_REVISION, General.BASENAME,
                   General.ORGANIZATION, General.BASE_MODEL_NAME.format(id=0),
                   General.BASE_MODEL_REPO_URL.format(id=0), General.BASE_MODEL_REVISION.format(id=0))


# tokenizer.* keys a target GGUF hands to the drafter that llama.cpp reads as one type (the others are
# copied as they are)
TOKENIZER_FIELDS = {f.name: f for f in (*(Field(key, "int", 0, U32_MAX) for key in Tokenizer.IDS),
                                        Field(Tokenizer.MODEL, "str", hi=64), Field(Tokenizer.PRE, "str", hi=64))}


def tokenizer_metadata(kv: dict[str, KV], path: object, error: type[InputError] = GGUFFormatError) -> list[KV]:
    """A GGUF's tokenizer.* entries in their order, each declared one (TOKENIZER_FIELDS) checked by the
    typed reader: a padding id that is a string, NaN or an array is refused in one line naming the file
    and the key, never copied into a drafter."""
    entries = [entry for key, entry in kv.items() if key.startswith(Tokenizer.PREFIX)]
    for entry in entries:
        if entry.key in TOKENIZER_FIELDS:
            TOKENIZER_FIELDS[entry.key].read(path, entry.value, error)
    return entries


def general_metadata(kv: dict[str, KV], path: object) -> dict[str, Any]:
    """A GGUF's general.* values, each text value checked by the typed reader (dflash_gguf/typed_reader.py):
    a declared text key (GENERAL_STRINGS) of another type or holding control characters, or any text
    that is not valid UTF-8, is refused in one line naming the file and the key."""

    out = {}
    for key, entry in kv.items():
        if not key.startswith("general."):
            continue
        if key in GENERAL_STRINGS and entry.type != GGUFValueType.STRING:
            raise GGUFFormatError(f"{path}: {key} is {entry.type.name}, not a STRING; the file is not a model GGUF "
                                  "this tool reads (fix or re-convert it)")
        if entry.type == GGUFValueType.STRING:  # free text (a description) may hold newlines, never bad UTF-8
            values.string(path, key, entry.value, 1 << 20, control_ok=True, error=GGUFFormatError)
            if key in GENERAL_STRINGS:  # surrounding whitespace is the license parser's to strip
                values.string(path, key, entry.value.strip(), 1 << 20, error=GGUFFormatError)
        out[key] = entry.value
    return out


FIRST_READ = 256 << 10  # first range read of a file object; each later read doubles what is held
# the most of a file object held before its tensor data: a 262k-token vocabulary is some 10 MiB, and a
# server that keeps sending keys (a header claiming 2^39 of them in a 1 TiB file) is stopped here
STREAM_HEADER_LIMIT = 256 << 20


_U64 = struct.Struct("<Q")
# The smallest encodings of a metadata pair (key length, value type, a one-byte value) and of a tensor
# info (name length, dimension count, type, offset): what a header's counts need at the least.
MIN_KV_BYTES = 8 + 4 + 1
MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8
READ_PIECE = 64 << 20  # tensor data is read from a file this much at a time


class GGUFFile:
    """A GGUF opened read-only, every structure bounds-checked.

    `source` is a path (mapped; tensor_rows reads the opened file instead) or a seekable binary file
    object, such as a remote file answering range reads: from one, only the header, metadata and
    tensor infos are read, into a prefix that doubles as parsing needs more, so the bytes read stay
    under twice `data_offset`.
    `name` labels a file object in messages.
    """

    def __init__(self, source: str | os.PathLike | BinaryIO, name: str | None = None):
        self.kv: dict[str, KV] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._map = None
        self._fh = None
        if isinstance(source, (str, os.PathLike)):
            self.path = Path(source)
            try:
                self._fh = open_regular(self.path, "GGUF file")
            except InputError as err:
                raise GGUFFormatError(str(err)) from None
            self.size = os.fstat(self._fh.fileno()).st_size
            self._stream = None
        else:
            self.path = Path(name or getattr(source, "name", "<stream>"))
            self._stream = source
            self.size = source.seek(0, os.SEEK_END)
        if self.size < 24:
            self.close()
            raise GGUFFormatError(f"{self.path}: {self.size} bytes is too short for a GGUF header (truncated?)")
        if self._stream is None:
            self._map = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ)
        else:
            self._map = b""
            self._fill(24)
        try:
            self._parse()
        except GGUFFormatError:
            self.close()
            raise
        except (struct.error, UnicodeDecodeError, ValueError, OverflowError) as err:
            self.close()
            raise GGUFFormatError(f"{self.path}: corrupt GGUF ({err})") from None

    @property
    def bytes_read(self) -> int:
        """Bytes read so far: the prefix held for a file object, the whole size for a mapped file."""
        return len(self._map) if self._stream is not None else self.size

    # -- parsing --------------------------------------------------------------------------------
    def _fill(self, end: int) -> None:
        """Hold bytes [0, end) of a file object, growing the prefix at least twofold per read."""
        have = len(self._map)
        if self._stream is None or end <= have:
            return
        if end > STREAM_HEADER_LIMIT:
            raise GGUFFormatError(f"{self.path}: its header and metadata run past {STREAM_HEADER_LIMIT >> 20} MiB "
                                  "before the tensor data: corrupt, or not a model GGUF")
        want = min(self.size, STREAM_HEADER_LIMIT, max(end, FIRST_READ, 2 * have))
        self._stream.seek(have)
        parts = [self._map]
        while have < want:
            chunk = self._stream.read(want - have)
            if not chunk:
                raise GGUFFormatError(f"{self.path}: the file ended at byte {have} of {self.size} while reading")
            parts.append(chunk)
            have += len(chunk)
        self._map = b"".join(parts)

    def _check(self, pos: int, n: int, what: str) -> None:
        if n < 0 or pos + n > self.size:
            raise GGUFFormatError(
                f"{self.path}: {what} runs past the end of the file at byte {pos} "
                f"(file is {self.size} bytes: truncated or corrupt)")

    def _need(self, pos: int, n: int, what: str) -> None:
        self._check(pos, n, what)
        self._fill(pos + n)

    def _unpack(self, fmt: str, pos: int, what: str) -> tuple[Any, int]:
        n = struct.calcsize(fmt)
        self._need(pos, n, what)
        return struct.unpack_from(fmt, self._map, pos)[0], pos + n

    def _string(self, pos: int, what: str) -> tuple[bytes, int]:
        length, pos = self._unpack("<Q", pos, what)
        self._need(pos, length, what)
        return self._map[pos:pos + length], pos + length

    def _strings(self, count: int, pos: int, what: str) -> tuple[list[str], int]:
        """An array of strings (a vocabulary: 150k+ of them), as _string would read each, in one loop."""
        items, unpack = [], _U64.unpack_from
        for _ in range(count):
            if pos + 8 > len(self._map):
                self._need(pos, 8, what)
            (length,) = unpack(self._map, pos)
            pos += 8
            if pos + length > len(self._map):
                self._need(pos, length, what)
            items.append(self._map[pos:pos + length].decode("utf-8", errors="surrogateescape"))
            pos += length
        return items, pos

    def _value(self, vtype: int, pos: int, what: str) -> tuple[Any, GGUFValueType | None, int]:
        vtype = GGUFValueType(vtype)
        if vtype in SCALAR:
            value, pos = self._unpack(SCALAR[vtype], pos, what)
            return value, None, pos
        if vtype == GGUFValueType.STRING:
            raw, pos = self._string(pos, what)
            return raw.decode("utf-8", errors="surrogateescape"), None, pos
        if vtype == GGUFValueType.ARRAY:
            sub, pos = self._unpack("<I", pos, what)
            count, pos = self._unpack("<Q", pos, what)
            sub = GGUFValueType(sub)
            if sub in SCALAR:
                width = struct.calcsize(SCALAR[sub])
                self._need(pos, count * width, what)
                dtype = np.dtype(SCALAR[sub].replace("?", "b1"))
                arr = np.frombuffer(self._map, dtype=dtype, count=count, offset=pos)
                return arr.tolist(), sub, pos + count * width
            if sub == GGUFValueType.ARRAY:
                raise GGUFFormatError(f"{self.path}: {what} is an array of arrays, which llama.cpp does not read: "
                                      "corrupt or not a model GGUF")
            if sub == GGUFValueType.STRING:
                items, pos = self._strings(count, pos, what)
                return items, sub, pos
            items = []
            for _ in range(count):
                item, _, pos = self._value(sub, pos, what)
                items.append(item)
            return items, sub, pos
        raise GGUFFormatError(f"{self.path}: {what} has unknown value type {vtype}")

    def _check_counts(self, n_kv: int, n_tensors: int, pos: int) -> None:
        """The header's counts against the bytes there are to hold them (each entry takes at least its
        smallest encoding; a file object's prefix stops at STREAM_HEADER_LIMIT): refused at once, not
        after reading up to where they run out."""
        room = (self.size if self._stream is None else min(self.size, STREAM_HEADER_LIMIT)) - pos
        need = n_kv * MIN_KV_BYTES + n_tensors * MIN_TENSOR_INFO_BYTES
        if need > room:
            raise GGUFFormatError(f"{self.path}: header claims {n_kv} metadata pairs and {n_tensors} tensors, which "
                                  f"take at least {need} bytes; the file has {room} bytes for them"
                                  + (f" (read up to {STREAM_HEADER_LIMIT >> 20} MiB)" if self._stream else "")
                                  + ": truncated, corrupt, or not a model GGUF")

    def _parse(self) -> None:
        if self._map[:4] != MAGIC:
            raise GGUFFormatError(f"{self.path}: not a GGUF file (magic {bytes(self._map[:4])!r})")
        version, pos = self._unpack("<I", 4, "header")
        if version not in (2, 3):
            raise GGUFFormatError(f"{self.path}: unsupported GGUF version {version}")
        n_tensors, pos = self._unpack("<Q", pos, "header")
        n_kv, pos = self._unpack("<Q", pos, "header")
        self._check_counts(n_kv, n_tensors, pos)
        for i in range(n_kv):
            key_raw, pos = self._string(pos, f"metadata entry {i}")
            key = key_raw.decode("utf-8", errors="replace")
            start = pos
            vtype, pos = self._unpack("<I", pos, f"metadata {key!r}")
            value, sub, pos = self._value(vtype, pos, f"metadata {key!r}")
            if key in self.kv:
                raise GGUFFormatError(f"{self.path}: metadata key {key!r} appears twice; llama.cpp refuses the file")
            self.kv[key] = KV(key, GGUFValueType(vtype), value, sub, bytes(self._map[start:pos]))
        for i in range(n_tensors):
            name_raw, pos = self._string(pos, f"tensor info {i}")
            name = name_raw.decode("utf-8", errors="replace")
            if len(name_raw) >= MAX_TENSOR_NAME:
                raise GGUFFormatError(f"{self.path}: tensor name {name[:40]!r}... is {len(name_raw)} bytes; llama.cpp "
                                      f"takes names shorter than {MAX_TENSOR_NAME}")
            if name in self.tensors:
                raise GGUFFormatError(f"{self.path}: tensor {name!r} appears twice; llama.cpp refuses the file")
            n_dims, pos = self._unpack("<I", pos, f"tensor {name!r}")
            if n_dims > MAX_DIMS:
                raise GGUFFormatError(f"{self.path}: tensor {name!r} claims {n_dims} dimensions (at most "
                                      f"{MAX_DIMS}): corrupt")
            dims = []
            for _ in range(n_dims):
                d, pos = self._unpack("<Q", pos, f"tensor {name!r}")
                dims.append(d)
            ttype, pos = self._unpack("<I", pos, f"tensor {name!r}")
            offset, pos = self._unpack("<Q", pos, f"tensor {name!r}")
            try:
                qtype = GGMLQuantizationType(ttype)
            except ValueError:
                raise GGUFFormatError(f"{self.path}: tensor {name!r} has unknown type {ttype}") from None
            block = GGML_QUANT_SIZES[qtype][0] if qtype in GGML_QUANT_SIZES else 0
            if not block or (dims and dims[0] % block):
                raise GGUFFormatError(f"{self.path}: tensor {name!r} of type {qtype.name} has rows of "
                                      f"{dims[0] if dims else 1} values, not a multiple of its block of {block}: corrupt")
            self.tensors[name] = TensorInfo(name, tuple(reversed(dims)), qtype, offset)
        align = self.alignment
        self.data_offset = -(-pos // align) * align
        expected = 0
        for t in self.tensors.values():
            if t.offset != expected:
                raise GGUFFormatError(
                    f"{self.path}: tensor {t.name!r} starts at data offset {t.offset}, expected {expected} (tensors "
                    "must follow each other, aligned; these overlap or leave gaps): corrupt, llama.cpp refuses it")
            self._check(self.data_offset + t.offset, t.nbytes, f"data of tensor {t.name!r}")
            expected += -(-t.nbytes // align) * align

    # -- access -----------------------------------------------------------------------------------
    @property
    def alignment(self) -> int:
        kv = self.kv.get(General.ALIGNMENT)
        if kv is None:
            return DEFAULT_ALIGNMENT
        if kv.type != GGUFValueType.UINT32 or kv.value <= 0 or kv.value & (kv.value - 1):
            raise GGUFFormatError(f"{self.path}: general.alignment = {kv.value!r} ({kv.type.name}) is not a power of 2 "
                                  "stored as UINT32; llama.cpp refuses the file")
        return int(kv.value)

    @property
    def architecture(self) -> str | None:
        kv = self.kv.get(General.ARCHITECTURE)
        return kv.value if kv else None

    def get(self, key: str, default: Any = None) -> Any:
        kv = self.kv.get(key)
        return kv.value if kv is not None else default

    def general(self) -> dict[str, Any]:
        """The general.* metadata, typed (general_metadata): what targets and licenses are read from."""
        return general_metadata(self.kv, self.path)

    def tensor_bytes(self, name: str) -> memoryview:
        self._local_data()
        t = self.tensors[name]
        start = self.data_offset + t.offset
        return memoryview(self._map)[start:start + t.nbytes]

    def tensor_span(self, name: str) -> FileSpan:
        """Where tensor `name`'s bytes lie in the file as it was opened: what the writer copies verbatim."""
        self._local_data()
        t = self.tensors[name]
        return FileSpan(self.path, self.data_offset + t.offset, t.nbytes, self._fh)

    def tensor_rows(self, name: str, first: int = 0, count: int | None = None) -> np.ndarray:
        """Rows [first, first + count) of tensor `name` (all of them by default; a row is its innermost
        dimension, the outer ones taken together) as a new uint8 array of shape (rows, bytes per row),
        what gguf-py's quants.dequantize takes. Read from the file as it was opened and checked, not
        through the map, so memory holds only the rows asked for; a file cut short since it was opened
        is refused."""
        self._local_data()
        t = self.tensors[name]
        block, type_size = GGML_QUANT_SIZES[t.type]
        row_bytes = (t.shape[-1] if t.shape else 1) // block * type_size
        n_rows = t.nbytes // row_bytes if row_bytes else 0
        count = n_rows - first if count is None else count
        if not 0 <= first <= first + count <= n_rows:
            raise ValueError(f"rows {first}..{first + count} of tensor {name!r}, which has {n_rows}")
        rows = np.empty((count, row_bytes), np.uint8)
        self._read_into(rows.reshape(-1), self.data_offset + t.offset + first * row_bytes, f"tensor {name!r}")
        return rows

    def _local_data(self) -> None:
        if self._stream is not None:
            raise GGUFFormatError(f"{self.path}: read for its metadata only; tensor data was not fetched")

    def _read_into(self, buf: np.ndarray, offset: int, what: str) -> None:
        """Fill `buf` (uint8, flat) from the opened file at `offset`, READ_PIECE at a time (a single read
        returns at most 2 GiB, and each piece is a temporary copy)."""
        done, fd = 0, self._fh.fileno()
        while done < buf.size:
            piece = os.pread(fd, min(buf.size - done, READ_PIECE), offset + done)
            if not piece:
                raise GGUFFormatError(f"{self.path}: {what} is cut short at byte {offset + done}: the file was "
                                      "truncated since it was opened")
            buf[done:done + len(piece)] = np.frombuffer(piece, np.uint8)
            done += len(piece)

    def close(self) -> None:
        if isinstance(self._map, mmap.mmap):
            self._map.close()
        self._map = None
        if self._fh is not None:
            self._fh.close()

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
