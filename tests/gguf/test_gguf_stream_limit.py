"""A GGUF read from a file object (a remote file answering range reads) is held only up to
STREAM_HEADER_LIMIT before its tensor data: a header whose keys, each well formed, never end stops
there; and a header that claims more keys than the file (or that limit) has room for, 2^39 of them in a
1 TiB file, is refused before any key is read."""

from __future__ import annotations

import io
import struct
import time

import pytest

from dflash_gguf.gguf import reader
from dflash_gguf.errors import GGUFFormatError

ENTRY = 32  # u64 length, 16-character key, u32 type, u32 value


class EndlessKeys(io.RawIOBase):
    """A 1 TiB GGUF whose header claims `keys` keys and whose every byte range holds well-formed ones."""

    size = 1 << 40

    def __init__(self, keys: int = 1 << 39):
        self.pos = 0
        self.served = 0
        self.keys = keys

    def seekable(self):
        return True

    def seek(self, offset, whence=io.SEEK_SET):
        self.pos = self.size + offset if whence == io.SEEK_END else offset
        return self.pos

    def _at(self, index: int) -> bytes:
        return struct.pack("<Q", 16) + f"{index:016x}".encode() + struct.pack("<II", 4, index & 0xFFFFFFFF)

    def read(self, n=-1):
        header = b"GGUF" + struct.pack("<IQQ", 3, 0, self.keys)
        start, end = self.pos, self.pos + n
        first, last = max(0, (start - 24) // ENTRY), (end - 24) // ENTRY + 1
        body = b"".join(self._at(i) for i in range(first, last))
        data = (header + body)[start:end] if first == 0 else body[start - 24 - first * ENTRY:end - 24 - first * ENTRY]
        self.pos += len(data)
        self.served += len(data)
        return data


def test_endless_metadata_from_a_stream_stops_at_the_limit(monkeypatch):
    monkeypatch.setattr(reader, "STREAM_HEADER_LIMIT", 1 << 20)
    source = EndlessKeys(1 << 16)  # 2 MiB of keys: room for their count, not for them
    with pytest.raises(GGUFFormatError, match="run past 1 MiB before the tensor data"):
        reader.GGUFFile(source, name="endless.gguf")
    assert source.served <= 1 << 20


def test_the_stream_reads_real_keys_below_the_limit():
    source = EndlessKeys()
    source.seek(0)
    first = source.read(24 + 2 * ENTRY)
    assert first[:4] == b"GGUF" and first[24 + 8:24 + 24] == b"0000000000000000"


@pytest.mark.parametrize("keys, needle", [(1 << 39, "the file has"), (1 << 35, "read up to 256 MiB")],
                         ids=["more-than-the-file-holds", "more-than-the-limit-holds"])
def test_a_key_count_no_file_could_hold_is_refused_at_once(keys, needle):
    source = EndlessKeys(keys)
    start = time.monotonic()
    with pytest.raises(GGUFFormatError, match=f"header claims {keys} metadata pairs.*{needle}"):
        reader.GGUFFile(source, name="claims.gguf")
    assert time.monotonic() - start < 1
    assert source.served <= reader.FIRST_READ
