"""Make a target memory-bound without changing what it computes: inert FFN units.

Every FFN of a SwiGLU target (Qwen3) becomes `n_ff` units wide: the new rows of `ffn_gate` and
`ffn_up` and the new columns of `ffn_down` are all zero, so each new unit computes
silu(0) * 0 = 0 and adds 0 to the output. The function, and so the greedy tokens, stay the target's
(`validate --baseline ORIGINAL` proves it on the real build), while every decoded token now streams
the whole widened FFN from memory: the regime of a real multi-GB model, where reading the
weights, not the arithmetic, sets the price of a token, so a verification of a block costs far
fewer of its tokens than on a target that decodes from the CPU caches, and drafting pays. (How few
depends on the machine's arithmetic: on 2 CPU cores a block of 8 still costs 1.5-2.3 tokens;
`make bench` section (f) measures it.)

    python -m benchmarks.memory_bound TARGET.gguf OUT.gguf [--n-ff N | --mib M]
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from dflash_gguf.gguf.format import KV, TensorInfo
from dflash_gguf.gguf.reader import GGUFFile
from dflash_gguf.gguf.writer import GGUFPlan, PlannedTensor, write_gguf

_FFN = re.compile(r"blk\.\d+\.ffn_(gate|up|down)\.weight")
_DTYPES = {GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.F32: np.float32}
QUANT_BLOCK = 256  # n_ff stays a multiple of the largest quant block (K-quants), so any type fits


def _widened(src: GGUFFile, info: TensorInfo, n_ff: int):
    dtype = _DTYPES.get(info.type)
    if dtype is None:
        raise ValueError(f"{src.path}: {info.name} is {info.type.name}; widen an F16 or F32 target "
                         "and quantize the result")
    rows, cols = info.shape
    # ffn_down is (n_embd, n_ff): new zero columns; ffn_gate/ffn_up are (n_ff, n_embd): new zero rows
    shape = (rows, n_ff) if info.name.endswith("ffn_down.weight") else (n_ff, cols)

    def chunks():
        new = np.zeros(shape, dtype=dtype)
        new[:rows, :cols] = np.frombuffer(src.tensor_bytes(info.name), dtype=dtype).reshape(rows, cols)
        yield new.tobytes()

    return PlannedTensor(TensorInfo(info.name, shape, info.type), chunks)


def ffn_bytes_per_unit(path: Path) -> int:
    with GGUFFile(path) as src:
        return sum(t.nbytes // (t.shape[0] if t.name.endswith(("gate.weight", "up.weight")) else t.shape[1])
                   for t in src.tensors.values() if _FFN.fullmatch(t.name))


def n_ff_for_size(path: Path, mib: float) -> int:
    """The FFN width that makes the file about `mib` MiB."""
    size = path.stat().st_size
    with GGUFFile(path) as src:
        arch = src.architecture
        n_ff = int(src.get(f"{arch}.feed_forward_length"))
    per_unit = ffn_bytes_per_unit(path)
    want = n_ff + max(0, int((mib * 2**20 - size) / per_unit))
    return -(-want // QUANT_BLOCK) * QUANT_BLOCK


def widen_ffn(target: Path, out: Path, n_ff: int) -> Path:
    """Write `target` with every FFN widened to `n_ff` units by inert all-zero units."""
    with GGUFFile(target) as src:
        arch = src.architecture
        key = f"{arch}.feed_forward_length"
        old_ff = int(src.get(key))
        if n_ff < old_ff:
            raise ValueError(f"--n-ff {n_ff} is narrower than the target's {old_ff}")
        plan = GGUFPlan()
        plan.add_kv(list(src.kv.values()))
        plan.add_kv([KV(key, GGUFValueType.UINT32, n_ff)])
        for info in src.tensors.values():
            if _FFN.fullmatch(info.name):
                plan.tensors.append(_widened(src, info, n_ff))
            else:
                span = src.tensor_span(info.name)
                plan.tensors.append(PlannedTensor(TensorInfo(info.name, info.shape, info.type),
                                                  lambda span=span: [span]))
        write_gguf(plan, out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path)
    parser.add_argument("out", type=Path)
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--n-ff", type=int, help="FFN width to widen to")
    size.add_argument("--mib", type=float, help="approximate file size to reach")
    args = parser.parse_args(argv)
    n_ff = args.n_ff or n_ff_for_size(args.target, args.mib)
    widen_ffn(args.target, args.out, n_ff)
    print(f"{args.out}: feed_forward_length {n_ff}, {args.out.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
