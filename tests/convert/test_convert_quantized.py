"""Quantized Hugging Face exports of drafters.

FP8 exports (tests/fixtures/published_drafters.py: compressed-tensors per channel, per tensor and per
128x128 block; DeepSeek-style `weight_scale_inv` per block) convert to GGUF tensors that hold the
FP8 value times its scale, rounded once to the requested outtype. The reference here is computed
apart from the converter: torch decodes float8_e4m3fn, float64 multiplies (exactly: 4 x 24 bits),
and the nearest value of the outtype is picked by exact distance among neighbours, ties to even.
Every other quantized export is refused in one line naming quant_method.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash_gguf.gguf import layout
from dflash_gguf.gguf.reader import GGUFFile
from tests.conftest import dflash_gguf
from tests.fixtures.published_drafters import PUBLISHED, cached_published
from training.fixtures.gguf_compare import differences
from tests.refusal import assert_refused

FP8_FAMILIES = [name for name in PUBLISHED if name.startswith("fp8-")]


@pytest.fixture(scope="session")
def published() -> Path:
    return cached_published()


# --- the reference ----------------------------------------------------------------------------

def _expand(scale: torch.Tensor, shape: tuple[int, int], block: tuple[int, int] | None) -> torch.Tensor:
    scale = scale.to(torch.float64)
    if scale.numel() == 1:
        return scale.reshape(1, 1).expand(shape)
    if block is None:  # per channel
        return scale.reshape(shape[0], 1).expand(shape)
    return scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:shape[0], :shape[1]]


def dequantized_reference(folder: Path) -> dict[str, np.ndarray]:
    """HF name -> float64 weight x scale, for every FP8 weight of the checkpoint."""
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    if config["quant_method"] == "fp8":
        suffix, block = "_scale_inv", config.get("weight_block_size")
    else:
        weights = config["config_groups"]["group_0"]["weights"]
        suffix, block = "_scale", weights["block_structure"]
    tensors = load_file(folder / "model.safetensors")
    out = {}
    for name, t in tensors.items():
        if t.dtype == torch.float8_e4m3fn:
            exact = t.to(torch.float64) * _expand(tensors[name + suffix], tuple(t.shape), block and tuple(block))
            out[name] = exact.numpy()
    return out


def _nearest(exact: np.ndarray, candidates: list[np.ndarray], codes: list[np.ndarray]) -> np.ndarray:
    """The code of the candidate nearest to `exact` (differences of neighbours are exact in float64),
    ties to the even code."""
    dist = np.stack([np.where(np.isnan(c), np.inf, np.abs(c - exact)) for c in candidates])
    best = dist.min(axis=0)
    code = np.stack(codes)
    tied_even = (dist == best) & (code % 2 == 0)
    pick = np.where(tied_even.any(axis=0), tied_even.argmax(axis=0), (dist == best).argmax(axis=0))
    return np.take_along_axis(code, pick[None], axis=0)[0]


def round_once(exact: np.ndarray, outtype: str) -> np.ndarray:
    """`exact` rounded to nearest-even in the outtype, as the raw codes a GGUF stores."""
    if outtype == "bf16":
        start = exact.astype(np.float32).view(np.uint32) >> 16
        codes = [(start.astype(np.int64) + d) & 0xFFFF for d in (-1, 0, 1)]
        cands = [(c.astype(np.uint32) << 16).view(np.float32).astype(np.float64) for c in codes]
        return _nearest(exact, cands, codes).astype(np.uint16)
    kind, bits = {"f16": (np.float16, np.uint16), "f32": (np.float32, np.uint32)}[outtype]
    start = exact.astype(kind).view(bits).astype(np.int64)
    codes = [(start + d) % (1 << (8 * np.dtype(bits).itemsize)) for d in (-1, 0, 1)]
    cands = [c.astype(bits).view(kind).astype(np.float64) for c in codes]
    return _nearest(exact, cands, codes).astype(bits)


def gguf_codes(f: GGUFFile, name: str) -> np.ndarray:
    info = f.tensors[name]
    bits = {"F32": np.uint32, "F16": np.uint16, "BF16": np.uint16}[info.type.name]
    return np.frombuffer(bytes(f.tensor_bytes(name)), dtype=bits).reshape(info.shape)


def gguf_name(hf_name: str, n_layers: int) -> str:
    for rule, bid in layout.expected_tensors(layout.DFLASH, n_layers):
        if rule.hf_name(bid) == hf_name:
            return rule.gguf_name(bid)
    raise KeyError(hf_name)


# --- FP8: exact ----------------------------------------------------------------------------------

@pytest.mark.parametrize("outtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("family", FP8_FAMILIES)
def test_fp8_is_dequantized_exactly(family, outtype, published, target_gguf, tmp_path):
    out = tmp_path / "fp8.gguf"
    proc = dflash_gguf("convert", published / family, "--target", target_gguf, "-o", out, "--outtype", outtype)
    assert proc.returncode == 0, proc.stderr
    reference = dequantized_reference(published / family)
    assert len(reference) == 1 + 7 * 2  # fc and seven projections per layer
    with GGUFFile(out) as f:
        assert not any(".weight_scale" in n or "input_scale" in n for n in f.tensors)
        for hf_name, exact in reference.items():
            ours = gguf_codes(f, gguf_name(hf_name, 2))
            np.testing.assert_array_equal(ours, round_once(exact, outtype), err_msg=hf_name)


def _double_rounding_pair() -> tuple[int, float]:
    """An FP8 code and a float32 scale whose product, rounded to float32 first, lands on a bf16 tie
    and then rounds the other way than the exact product does."""
    codes = torch.arange(0x38, 0x78, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float64)
    rng = np.random.default_rng(7)
    for scale in rng.uniform(0.5, 1.0, 20000).astype(np.float32):
        exact = codes.numpy() * np.float64(scale)
        via_f32 = torch.from_numpy(exact.astype(np.float32)).to(torch.bfloat16).view(torch.uint16).numpy()
        once = round_once(exact, "bf16")
        hit = np.nonzero(via_f32 != once)[0]
        if hit.size:
            return 0x38 + int(hit[0]), float(scale)
    raise AssertionError("no double-rounding case found")


def test_fp8_rounds_once_not_through_float32(published, target_gguf, tmp_path):
    """A product that float32 would round onto a bf16 tie: the GGUF holds the correctly rounded value."""
    code, scale = _double_rounding_pair()
    folder = shutil.copytree(published / "fp8-tensor", tmp_path / "fp8-tie")
    tensors = load_file(folder / "model.safetensors")
    weight = tensors["fc.weight"].view(torch.uint8).clone()
    weight[0, 0] = code
    tensors["fc.weight"] = weight.view(torch.float8_e4m3fn)
    tensors["fc.weight_scale"] = torch.tensor([scale], dtype=torch.float32)
    save_file(tensors, folder / "model.safetensors")
    out = tmp_path / "tie.gguf"
    proc = dflash_gguf("convert", folder, "--target", target_gguf, "-o", out, "--outtype", "bf16")
    assert proc.returncode == 0, proc.stderr
    exact = np.float64(torch.tensor([code], dtype=torch.uint8).view(torch.float8_e4m3fn).double().item()) * np.float64(scale)
    via_f32 = torch.tensor([exact], dtype=torch.float32).to(torch.bfloat16).view(torch.uint16).item()
    with GGUFFile(out) as f:
        got = int(gguf_codes(f, "fc.weight")[0, 0])
    assert got == int(round_once(np.array([exact]), "bf16")[0]) != via_f32


# --- FP8: the pinned converter writes the same bytes where it reads the format ----------------------

@pytest.mark.upstream
@pytest.mark.parametrize("outtype", ["auto", "f32", "bf16", "f16", "q8_0"])
@pytest.mark.parametrize("family", ["fp8-channel", "fp8-block", "fp8-block-ct"])
def test_fp8_matches_upstream(family, outtype, published, fixtures, tmp_path):
    """Upstream dequantizes in float32 then rounds again; with these scales no product falls between,
    so the files agree byte for byte. (Upstream refuses compressed-tensors per-tensor FP8: it asserts
    strategy channel or block.)"""
    from training.fixtures.upstream import run_upstream_converter

    theirs = run_upstream_converter(published / family, tmp_path / "theirs.gguf", outtype, fixtures / "target-hf")
    ours = tmp_path / "ours.gguf"
    proc = dflash_gguf("convert", published / family, "--target", fixtures / "target-hf", "-o", ours, "--outtype", outtype)
    assert proc.returncode == 0, proc.stderr
    assert differences(ours, theirs) == []


# --- other quantized exports: refused in one line -----------------------------------------------------

REFUSED = {
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
    "w4a16": {"quant_method": "compressed-tensors", "format": "pack-quantized",
              "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                  "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}}}},
    "nvfp4": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
              "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                  "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}}}},
    "modelopt-nvfp4": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16},
    "bitsandbytes": {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
    "int8": {"quant_method": "compressed-tensors", "format": "int-quantized",
             "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                 "num_bits": 8, "type": "int", "strategy": "channel"}}}},
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_other_quantized_exports_are_refused(case, drafter_copy, target_gguf, tmp_path):
    folder = drafter_copy("dflash-b16")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = REFUSED[case]
    (folder / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out.gguf"
    proc = dflash_gguf("convert", folder, "--target", target_gguf, "-o", out)
    method = REFUSED[case]["quant_method"]
    assert_refused(proc, "config.json", f"quantization_config.quant_method = {method!r}", "unquantized", out=out)


def _edit_safetensors(folder: Path, change) -> Path:
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors")
    return folder


BROKEN_FP8 = {
    "no-quantization-config": (
        lambda d: (d / "config.json").write_text(json.dumps(
            {k: v for k, v in json.loads((d / "config.json").read_text()).items() if k != "quantization_config"})),
        ["fc.weight", "float8_e4m3fn", "quantization_config"]),
    "missing-scale": (lambda d: _edit_safetensors(d, lambda t: t.pop("fc.weight_scale_inv")),
                      ["fc.weight", "fc.weight_scale_inv"]),
    "scale-of-no-block": (lambda d: _edit_safetensors(d, lambda t: t.update({"fc.weight_scale_inv": torch.ones(3, 3)})),
                          ["fc.weight_scale_inv", "[3, 3]", "[64, 192]"]),
}


@pytest.mark.parametrize("case", list(BROKEN_FP8))
def test_broken_fp8_exports_are_refused(case, published, target_gguf, tmp_path):
    folder = shutil.copytree(published / "fp8-block", tmp_path / "fp8")
    change, needles = BROKEN_FP8[case]
    change(folder)
    out = tmp_path / "out.gguf"
    assert_refused(dflash_gguf("convert", folder, "--target", target_gguf, "-o", out), *needles, out=out)


# --- FP8: loads and drafts what the reference drafts ----------------------------------------------

@pytest.mark.integration
@pytest.mark.parametrize("family", ["fp8-channel", "fp8-block"])
def test_fp8_drafter_drafts_the_reference_draft(family, llama_bin, published, fixtures, tmp_path):
    """llama-speculative-simple's first draft with the converted FP8 drafter equals the z-lab
    reference's on the dequantized weights (float32 on both sides, as tests/runner/test_patches.py does)."""
    from dflash_gguf.convert.converter import convert
    from training.fixtures.target_model import convert_target
    from tests.llama_tools import parse_drafts, run_tool
    from tests.reference_drafts import reference_draft, tokenize
    from tests.runner.test_patches import F32_CACHES, N_DRAFT, PROMPT

    # the reference reads an unquantized checkpoint: the dequantized weights in float32
    plain = tmp_path / "dequantized"
    plain.mkdir()
    config = json.loads((published / family / "config.json").read_text())
    del config["quantization_config"]
    (plain / "config.json").write_text(json.dumps(config))
    tensors = {n: t for n, t in load_file(published / family / "model.safetensors").items()
               if not n.endswith(("_scale", "_scale_inv"))}
    tensors.update({n: torch.from_numpy(v.astype(np.float32)) for n, v in dequantized_reference(published / family).items()})
    save_file(tensors, plain / "model.safetensors")

    target = convert_target(fixtures / "target-hf", tmp_path / "target-f32.gguf", "f32")
    drafter = convert(published / family, target, tmp_path / "fp8-f32.gguf", "f32")
    assert drafter.outtype == "f32"
    ids = tokenize(fixtures / "target-hf", PROMPT)
    proc = run_tool(llama_bin, "llama-speculative-simple", "-m", target, "-md", tmp_path / "fp8-f32.gguf",
                    "--spec-type", "draft-dflash", "--spec-draft-n-max", str(N_DRAFT), "-p", PROMPT,
                    "-n", str(N_DRAFT + 1), "--temp", "0", "-c", "512", "-t", "1", *F32_CACHES, "-lv", "5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    drafts = parse_drafts(proc.stderr)
    assert drafts and drafts[0].id_last == ids[-1]
    assert drafts[0].ids == reference_draft(plain, fixtures / "target-hf", ids[:-1], ids[-1], N_DRAFT)
