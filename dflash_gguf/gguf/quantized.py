"""Quantized Hugging Face exports of drafters (what circulates for vLLM / SGLang).

FP8 exports (`float8_e4m3fn` weights beside a scale) are dequantized exactly: each weight is the
FP8 value times its scale, a product float64 holds without rounding, so the only rounding is the
one to the requested outtype. Scales are per tensor, per output channel, or per block:

    compressed-tensors  quant_method "compressed-tensors", format "float-quantized", 8-bit float
                        weights; `<name>.weight_scale` (strategy tensor / channel / group / block)
    DeepSeek / HF FP8   quant_method "fp8" (fmt e4m3); `<name>.weight_scale_inv`, a multiplier
                        despite its name, per block of `weight_block_size` (or one per tensor)

Any other quantization is refused in one line naming `quantization_config.quant_method`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import CheckpointError
from . import config_values as cv
from .safetensors_file import StoredTensor, iter_row_chunks, to_float32

FP8 = "F8_E4M3"
SCALE_SUFFIXES = ("_scale_inv", "_scale")  # appended to "<module>.weight"
# Activation and KV-cache scales: what a runtime quantizing activations needs, nothing llama.cpp reads.
UNUSED_SUFFIXES = (".input_scale", ".activation_scale", ".output_scale", ".k_scale", ".v_scale",
                   ".weight_zero_point", ".input_zero_point")


def _e4m3_values() -> np.ndarray:
    """float8_e4m3fn's 256 codes as float64: 1 sign, 4 exponent (bias 7), 3 mantissa bits, no
    infinities, NaN at S.1111.111."""
    code = np.arange(256)
    sign = np.where(code & 0x80, -1.0, 1.0)
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    magnitude = np.where(exponent == 0, mantissa / 8 * 2.0 ** -6, (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    values = sign * magnitude
    values[(code & 0x7F) == 0x7F] = np.nan
    return values


E4M3 = _e4m3_values()


@dataclass(frozen=True)
class FP8Weight:
    """A float8_e4m3fn weight and its scale, read as the float64 products they stand for."""

    weight: StoredTensor
    scale: StoredTensor
    block: tuple[int, int]  # rows x columns one scale covers

    @property
    def name(self) -> str:
        return self.weight.name

    @property
    def file(self) -> Path:
        return self.weight.file

    @property
    def shape(self) -> tuple[int, ...]:
        return self.weight.shape

    dtype = FP8

    def _scales(self) -> np.ndarray:
        """The scale grid, [row blocks, column blocks], as float64."""
        raw = np.concatenate([c.reshape(-1) for c in iter_row_chunks(self.scale)]) if self.scale.nbytes else np.empty(0)
        grid = to_float32(raw, self.scale.dtype).astype(np.float64)
        rows, cols = self.shape
        return grid.reshape(-(-rows // self.block[0]), -(-cols // self.block[1]))

    def iter_rows(self) -> Iterator[np.ndarray]:
        """Consecutive blocks of whole rows, float64, each value exactly weight x scale."""
        grid = self._scales()
        cols = self.shape[1]
        first = 0
        for raw in iter_row_chunks(self.weight):
            rows = np.arange(first, first + raw.shape[0]) // self.block[0]
            scale = np.repeat(grid[rows], self.block[1], axis=1)[:, :cols]
            yield E4M3[raw] * scale
            first += raw.shape[0]


@dataclass(frozen=True)
class FP8Scheme:
    """What a checkpoint's quantization_config says about its FP8 weights."""

    scale_suffix: str  # "_scale" or "_scale_inv"
    blocks: tuple[tuple[int, int], ...]  # block shapes the config names (group g is (1, g))


def fp8_scheme(config: dict, config_path: Path) -> FP8Scheme | None:
    """None for an unquantized checkpoint; the FP8 scheme; or a one-line refusal for the rest. Every
    field is read as config_values declares it (a wrong type is refused, never guessed)."""
    qc = config.get("quantization_config")
    if qc is None:
        return None
    qc = cv.read(config_path, "quantization_config", qc)

    def field(name: str, value, default=None):
        return cv.read(config_path, f"quantization_config.{name}", value, default)

    method = field("quant_method", qc.get("quant_method"))
    if method == "fp8" and field("fmt", qc.get("fmt"), "e4m3") == "e4m3":
        block = field("weight_block_size", qc.get("weight_block_size"))
        if block is not None and len(block) != 2:
            raise CheckpointError(f"{config_path}: field 'quantization_config.weight_block_size' = {block} is not "
                                  "[rows, columns]; fix it in the config")
        return FP8Scheme("_scale_inv", (tuple(block),) if block else ())
    fmt = field("format", qc.get("format"))
    if method == "compressed-tensors" and fmt == "float-quantized":
        groups = []
        for group in field("config_groups", qc.get("config_groups"), {}).values():
            group = field("config_groups", group, {})  # each group an object too
            groups.append(field("config_groups.weights", group.get("weights"), {}))
        if groups and all(field("config_groups.weights.type", w.get("type")) == "float"
                          and field("config_groups.weights.num_bits", w.get("num_bits")) == 8 for w in groups):
            blocks = []
            for w in groups:
                structure = field("config_groups.weights.block_structure", w.get("block_structure") or None)
                group = field("config_groups.weights.group_size", w.get("group_size") or None)
                if structure is not None:
                    if len(structure) != 2:
                        raise CheckpointError(f"{config_path}: a block_structure in quantization_config is not "
                                              "[rows, columns]; fix it in the config")
                    blocks.append(tuple(structure))
                elif group is not None:
                    blocks.append((1, group))
            return FP8Scheme("_scale", tuple(blocks))
    what = repr(method)
    if method == "compressed-tensors" and fmt:
        what += f" (format {fmt!r})"
    raise CheckpointError(
        f"{config_path}: quantization_config.quant_method = {what}: a quantized export this converter "
        "cannot dequantize (only FP8 float8_e4m3fn exports are); convert the unquantized (bf16/fp16) checkpoint")


def _block(weight: StoredTensor, scale: StoredTensor, scheme: FP8Scheme) -> tuple[int, int] | None:
    """The rows x columns each scale value covers, from the scale's shape, or None if it fits none."""
    if len(weight.shape) != 2:
        return None
    rows, cols = weight.shape
    n = int(np.prod(scale.shape, dtype=np.int64))
    if n == 1:
        return rows, cols  # per tensor
    if scale.shape in ((rows,), (rows, 1)):
        return 1, cols  # per output channel
    for br, bc in scheme.blocks:
        if scale.shape == (-(-rows // br), -(-cols // bc)):
            return br, bc
    return None


def dequantized(tensors: dict[str, StoredTensor], config: dict, config_path: Path,
                ) -> dict[str, StoredTensor | FP8Weight]:
    """The checkpoint's tensors with every FP8 weight and its scale replaced by one FP8Weight, and
    activation scales dropped. Refuses other quantized exports and FP8 tensors without a scale."""
    scheme = fp8_scheme(config, config_path)
    fp8 = [name for name, t in tensors.items() if t.dtype == FP8]
    if scheme is None:
        if fp8:
            raise CheckpointError(
                f"{tensors[fp8[0]].file}: tensor {fp8[0]!r} is float8_e4m3fn but config.json has no "
                "quantization_config naming its scales; convert the unquantized checkpoint")
        return tensors
    out: dict[str, StoredTensor | FP8Weight] = {}
    scales = set()
    for name in fp8:
        weight = tensors[name]
        scale_name = name + scheme.scale_suffix
        scale = tensors.get(scale_name)
        if scale is None:
            raise CheckpointError(
                f"{weight.file}: FP8 tensor {name!r} has no {scale_name!r}; the export is incomplete")
        if scale.dtype not in ("F32", "BF16", "F16"):
            raise CheckpointError(f"{scale.file}: scale {scale_name!r} has dtype {scale.dtype}; FP8 scales are floats")
        block = _block(weight, scale, scheme)
        if block is None:
            raise CheckpointError(
                f"{scale.file}: scale {scale_name!r} has shape {list(scale.shape)}, which is neither per tensor, "
                f"per channel nor one of the blocks in quantization_config for weight shape {list(weight.shape)}")
        out[name] = FP8Weight(weight, scale, block)
        scales.add(scale_name)
    for name, t in tensors.items():
        if name in out or name in scales or name.endswith(UNUSED_SUFFIXES):
            continue
        if name.endswith(SCALE_SUFFIXES):
            raise CheckpointError(
                f"{t.file}: scale {name!r} belongs to no FP8 weight; the export is inconsistent")
        out[name] = t
    return out
