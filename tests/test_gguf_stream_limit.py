"""A GGUF read from a file object (a remote file answering range reads) is held only up to
STREAM_HEADER_LIMIT before its tensor data: a header that claims 2^39 keys in a 1 TiB file, each key
well formed, ends in one error instead of reading until the claimed size."""

from __future__ import annotations

import io
import struct

import pytest

from dflash_gguf.gguf import file as gguf_file
from dflash_gguf.errors import GGUFFormatError

ENTRY = 32  # u64 length, 16-character key, u32 type, u32 value


class EndlessKeys(io.RawIOBase):
    """A 1 TiB GGUF whose header claims 2^39 keys and whose every byte range holds well-formed ones."""

    size = 1 << 40

    def __init__(self):
        self.pos = 0
        self.served = 0

    def seekable(self):
        return True

    def seek(self, offset, whence=io.SEEK_SET):
        self.pos = self.size + offset if whence == io.SEEK_END else offset
        return self.pos

    def _at(self, index: int) -> bytes:
        return struct.pack("<Q", 16) + f"{index:016x}".encode() + struct.pack("<II", 4, index & 0xFFFFFFFF)

    def read(self, n=-1):
        header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 39)
        start, end = self.pos, self.pos + n
        first, last = max(0, (start - 24) // ENTRY), (end - 24) // ENTRY + 1
        body = b"".join(self._at(i) for i in range(first, last))
        data = (header + body)[start:end] if first == 0 else body[start - 24 - first * ENTRY:end - 24 - first * ENTRY]
        self.pos += len(data)
        self.served += len(data)
        return data


def test_endless_metadata_from_a_stream_stops_at_the_limit(monkeypatch):
    monkeypatch.setattr(gguf_file, "STREAM_HEADER_LIMIT", 1 << 20)
    source = EndlessKeys()
    with pytest.raises(GGUFFormatError, match="run past 1 MiB before the tensor data"):
        gguf_file.GGUFFile(source, name="endless.gguf")
    assert source.served <= 1 << 20


def test_the_stream_reads_real_keys_below_the_limit():
    source = EndlessKeys()
    source.seek(0)
    first = source.read(24 + 2 * ENTRY)
    assert first[:4] == b"GGUF" and first[24 + 8:24 + 24] == b"0000000000000000"
