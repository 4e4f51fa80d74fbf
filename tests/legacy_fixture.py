"""Build a legacy fork GGUF (`dflash-draft`) from a mainline one: the inverse of the migration,
so tests can check that migrating it gives back exactly what upstream writes."""

from __future__ import annotations

from pathlib import Path

from gguf import GGUFValueType

from dflash_gguf.gguf import layout
from dflash_gguf.gguf.format import KV, TensorInfo
from dflash_gguf.gguf.keys import ARCH, LEGACY_ARCH
from dflash_gguf.gguf.reader import GGUFFile
from dflash_gguf.gguf.writer import GGUFPlan, PlannedTensor, write_gguf

_RENAMED_BACK = {new: old for old, new in layout.LEGACY_TENSOR_RENAMES.items()}


def make_legacy(mainline: Path, out: Path) -> Path:
    with GGUFFile(mainline) as src:
        a, old = ARCH + ".", LEGACY_ARCH + "."
        nested = old + "dflash."
        plan = GGUFPlan()
        for key, kv in src.kv.items():
            if key == "general.architecture":
                kv = KV(key, GGUFValueType.STRING, LEGACY_ARCH)
            elif key == a + "block_size":
                kv = KV(nested + "block_size", kv.type, kv.value)
            elif key == a + "target_layers":
                kv = KV(nested + "target_layer_ids", GGUFValueType.ARRAY, [i - 1 for i in kv.value],
                        GGUFValueType.INT32)
            elif key == "tokenizer.ggml.mask_token_id":
                kv = KV(nested + "mask_token_id", kv.type, kv.value)
            elif key.startswith(a):
                kv = KV(old + key[len(a):], kv.type, kv.value, kv.sub_type, kv.raw)
            plan.add_kv([kv])
        fc = src.tensors["fc.weight"]
        plan.add_kv([KV(nested + "n_target_features", GGUFValueType.UINT32, fc.shape[-1])])
        for name, info in src.tensors.items():
            data = bytes(src.tensor_bytes(name))
            plan.tensors.append(PlannedTensor(TensorInfo(_RENAMED_BACK.get(name, name), info.shape, info.type),
                                              lambda data=data: [data]))
        write_gguf(plan, out)
    return out
