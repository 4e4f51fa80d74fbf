"""Read the tensors of a small `torch.save` file (zip format) without PyTorch and without running
its pickle: only plain containers, numbers, strings and tensors are rebuilt; anything else refuses.

Used for `mask_embedding.pt` (MiMo drafters): {"mask_token_id": int, "embedding": tensor}.
"""

from __future__ import annotations

import collections
import pickle
import struct
import zipfile
import zlib
from typing import Any

import numpy as np

from ..errors import CheckpointError
from ..terminal import shown

# torch's legacy storage classes, as torch.save pickles them -> (numpy dtype, safetensors name)
STORAGES = {
    "FloatStorage": (np.dtype("<f4"), "F32"),
    "HalfStorage": (np.dtype("<f2"), "F16"),
    "BFloat16Storage": (np.dtype("<u2"), "BF16"),  # raw bits
    "DoubleStorage": (np.dtype("<f8"), "F64"),
    "LongStorage": (np.dtype("<i8"), "I64"),
    "IntStorage": (np.dtype("<i4"), "I32"),
}


MAX_FILE = 64 << 20      # bytes of a .pt file here: a mask embedding is one row of floats
MAX_ENTRIES = 1024       # members of its zip archive
MAX_PICKLE = 1 << 20     # bytes of its data.pkl


class TorchTensor:
    """A tensor read from a .pt file: raw values (bf16 as bits) and their safetensors dtype name."""

    __slots__ = ("values", "dtype")  # a pickle's BUILD cannot set anything else on it

    def __init__(self, values: np.ndarray, dtype: str):
        self.values, self.dtype = values, dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 40


def _rebuild_tensor(storage, offset, size, stride, *_):
    if not (isinstance(storage, tuple) and len(storage) == 2 and isinstance(storage[0], np.ndarray)):
        raise pickle.UnpicklingError("a tensor without a storage")
    if not (_count(offset) and isinstance(size, tuple) and isinstance(stride, tuple) and len(size) == len(stride)
            and len(size) <= 8 and all(map(_count, size + stride))):
        raise pickle.UnpicklingError("a tensor whose offset, size or stride are not whole numbers")
    data, dtype = storage
    contiguous = tuple(int(np.prod(size[i + 1:], dtype=np.int64)) for i in range(len(size)))
    if any(n > 1 and s != c for n, s, c in zip(size, stride, contiguous)):
        raise pickle.UnpicklingError("non-contiguous tensor")
    count = int(np.prod(size, dtype=np.int64))
    if offset + count > data.size:
        raise pickle.UnpicklingError("tensor runs past its storage")
    return TorchTensor(data[offset:offset + count].reshape(size), dtype)


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, archive: zipfile.ZipFile, prefix: str):
        super().__init__(file)
        self.archive, self.prefix = archive, prefix

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in (("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor")):
            return _rebuild_tensor
        if module == "torch" and name in STORAGES:
            return name
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise pickle.UnpicklingError(f"{module}.{name} is not a plain tensor container")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and pid[1] in STORAGES):
            raise pickle.UnpicklingError(f"unsupported storage {pid!r}")
        np_dtype, dtype = STORAGES[pid[1]]
        if not isinstance(pid[2], str):
            raise pickle.UnpicklingError(f"unsupported storage key {pid[2]!r}")
        raw = self.archive.read(f"{self.prefix}data/{pid[2]}")
        if len(raw) % np_dtype.itemsize:
            raise pickle.UnpicklingError(f"storage {pid[2]!r} is not a whole number of {pid[1]} values")
        return np.frombuffer(raw, dtype=np_dtype), dtype


def _check_archive(archive: zipfile.ZipFile, path: object) -> None:
    """Refuse what would cost more than the file holds, or cannot be read, before reading a member."""
    members = archive.infolist()
    if len(members) > MAX_ENTRIES:
        raise CheckpointError(f"{shown(path)}: {len(members)} members; a torch.save file of a mask embedding has a few")
    for info in members:
        if info.flag_bits & 0x1:
            raise CheckpointError(f"{shown(path)}: member {shown(info.filename)} is encrypted; not a torch.save file")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise CheckpointError(f"{shown(path)}: member {shown(info.filename)} uses compression {info.compress_type}; "
                                  "torch.save stores its members uncompressed")
    if sum(info.file_size for info in members) > MAX_FILE:
        raise CheckpointError(f"{shown(path)}: its members unpack to more than {MAX_FILE >> 20} MiB; "
                              "a mask embedding is one vector")


def load_torch_file(source) -> Any:
    """The object a torch.save zip file holds, with tensors as TorchTensor. `source`: a file opened
    by the confined reader (confine.Opened), or a path."""
    path = getattr(source, "path", source)
    size = getattr(source, "size", None)
    if size is not None and size > MAX_FILE:
        raise CheckpointError(f"{shown(path)}: {size} bytes, more than the {MAX_FILE >> 20} MiB a mask embedding "
                              "could be")
    try:
        with zipfile.ZipFile(source.rewound() if hasattr(source, "rewound") else path) as archive:
            _check_archive(archive, path)
            pkl = next((n for n in archive.namelist() if n.endswith("/data.pkl")), None)
            if pkl is None:
                raise CheckpointError(f"{shown(path)}: no data.pkl inside; not a torch.save file")
            if archive.getinfo(pkl).file_size > MAX_PICKLE:
                raise CheckpointError(f"{shown(path)}: data.pkl is over {MAX_PICKLE >> 20} MiB; not a mask embedding")
            with archive.open(pkl) as fh:
                return _Unpickler(fh, archive, pkl[: -len("data.pkl")]).load()
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, zlib.error, EOFError, RuntimeError,
            NotImplementedError) as err:
        raise CheckpointError(f"{shown(path)}: not a readable torch.save zip file ({shown(err)})") from None
    except (pickle.UnpicklingError, KeyError, ValueError, TypeError, AttributeError, IndexError, RecursionError,
            MemoryError, OverflowError, struct.error) as err:
        raise CheckpointError(f"{shown(path)}: cannot read ({shown(str(err)[:120])}); expected a dict of plain "
                              "tensors") from None
