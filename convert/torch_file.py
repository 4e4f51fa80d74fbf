"""Read the tensors of a small `torch.save` file (zip format) without PyTorch and without running
its pickle: only plain containers, numbers, strings and tensors are rebuilt; anything else refuses.

Used for `mask_embedding.pt` (MiMo drafters): {"mask_token_id": int, "embedding": tensor}.
"""

from __future__ import annotations

import collections
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CheckpointError

# torch's legacy storage classes, as torch.save pickles them -> (numpy dtype, safetensors name)
STORAGES = {
    "FloatStorage": (np.dtype("<f4"), "F32"),
    "HalfStorage": (np.dtype("<f2"), "F16"),
    "BFloat16Storage": (np.dtype("<u2"), "BF16"),  # raw bits
    "DoubleStorage": (np.dtype("<f8"), "F64"),
    "LongStorage": (np.dtype("<i8"), "I64"),
    "IntStorage": (np.dtype("<i4"), "I32"),
}


class TorchTensor:
    """A tensor read from a .pt file: raw values (bf16 as bits) and their safetensors dtype name."""

    def __init__(self, values: np.ndarray, dtype: str):
        self.values, self.dtype = values, dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)


def _rebuild_tensor(storage, offset, size, stride, *_):
    data, dtype = storage
    size, stride = tuple(size), tuple(stride)
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
        raw = self.archive.read(f"{self.prefix}data/{pid[2]}")
        return np.frombuffer(raw, dtype=np_dtype), dtype


def load_torch_file(path: Path) -> Any:
    """The object a torch.save zip file holds, with tensors as TorchTensor."""
    try:
        with zipfile.ZipFile(path) as archive:
            pkl = next((n for n in archive.namelist() if n.endswith("/data.pkl")), None)
            if pkl is None:
                raise CheckpointError(f"{path}: no data.pkl inside; not a torch.save file")
            with archive.open(pkl) as fh:
                return _Unpickler(fh, archive, pkl[: -len("data.pkl")]).load()
    except (zipfile.BadZipFile, OSError) as err:
        raise CheckpointError(f"{path}: not a readable torch.save zip file ({err})") from None
    except (pickle.UnpicklingError, KeyError, ValueError, EOFError) as err:
        raise CheckpointError(f"{path}: cannot read ({err}); expected a dict of plain tensors") from None
