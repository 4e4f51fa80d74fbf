"""Convert a 2 GiB bf16 drafter (Qwen3-8B DFlash b16 geometry) with dflash-gguf and with the pinned
upstream converter, side by side in one run; print the ratios of wall time and peak memory and check
that both outputs are the same.

    make bench-convert            # or: .venv/bin/python -m benchmarks.bench_convert [--json OUT]

The drafter (seeded random weights) and a weightless target folder are generated once under the
cache folder; nothing is committed or downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from dflash_gguf.paths import cache_dir
from dflash_gguf.runner.sdist import upstream_converter
from training.fixtures.tiny_models import cached_fixtures
from training.fixtures.gguf_compare import differences

# Qwen3-8B DFlash b16: hidden 4096, 5 draft layers, ffn 12288, 32 heads / 8 kv heads of 128, 5 taps.
HIDDEN, LAYERS, FFN, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 4096, 5, 12288, 32, 8, 128, 151936
TARGET_LAYER_IDS = [1, 9, 17, 25, 33]
TARGET_DEPTH = 36


def _drafter_shapes() -> dict[str, tuple[int, ...]]:
    shapes = {"fc.weight": (HIDDEN, len(TARGET_LAYER_IDS) * HIDDEN), "hidden_norm.weight": (HIDDEN,),
              "norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (HIDDEN,), p + "post_attention_layernorm.weight": (HIDDEN,),
            p + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
            p + "self_attn.q_norm.weight": (HEAD_DIM,), p + "self_attn.k_norm.weight": (HEAD_DIM,),
            p + "mlp.gate_proj.weight": (FFN, HIDDEN), p + "mlp.up_proj.weight": (FFN, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, FFN),
        })
    return shapes


def _write_random_bf16_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], seed: int = 0) -> None:
    """Stream seeded bf16 weights into a safetensors file without holding it in memory."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        nbytes = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".partial")
    with open(tmp, "wb") as fh:
        fh.write(struct.pack("<Q", len(blob)) + blob)
        for shape in shapes.values():
            n = int(np.prod(shape))
            for start in range(0, n, 1 << 24):
                count = min(1 << 24, n - start)
                values = rng.standard_normal(count, dtype=np.float32) * np.float32(0.02)
                fh.write((values.view(np.uint32) >> 16).astype(np.uint16).tobytes())
    tmp.rename(path)


def prepare() -> tuple[Path, Path]:
    root = cache_dir() / "bench" / "qwen3-8b-dflash-b16"
    drafter, target = root / "drafter", root / "target-hf"
    if not (drafter / "model.safetensors").is_file():
        drafter.mkdir(parents=True, exist_ok=True)
        print("generating the 2 GiB bf16 drafter (once)...", file=sys.stderr)
        config = {
            "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": HIDDEN,
            "num_hidden_layers": LAYERS, "intermediate_size": FFN, "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": VOCAB,
            "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
            "block_size": 16, "num_target_layers": TARGET_DEPTH, "torch_dtype": "bfloat16",
            "dflash_config": {"mask_token_id": 151669, "target_layer_ids": TARGET_LAYER_IDS},
        }
        (drafter / "config.json").write_text(json.dumps(config, indent=2))
        _write_random_bf16_safetensors(drafter / "model.safetensors", _drafter_shapes())
    if not (target / "config.json").is_file():
        target.mkdir(parents=True, exist_ok=True)
        tiny = cached_fixtures() / "target-hf"
        config = json.loads((tiny / "config.json").read_text())
        config.update(hidden_size=HIDDEN, num_hidden_layers=TARGET_DEPTH, intermediate_size=FFN,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM)
        (target / "config.json").write_text(json.dumps(config, indent=2))
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            (target / name).write_bytes((tiny / name).read_bytes())
    return drafter, target


def measure(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> dict:
    """Wall seconds and peak RSS (MiB) of one child process, from its own rusage."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    stderr = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"command failed: {' '.join(cmd)}\n{stderr[-2000:]}")
    scale = 1024 if sys.platform != "darwin" else 1
    return {"seconds": round(wall, 2), "peak_mib": round(usage.ru_maxrss * scale / 2**20, 1)}


def compare(progress=lambda msg: print(msg, file=sys.stderr), keep: bool = False) -> dict:
    """Both converters on the bench drafter, one after the other; their wall time, peak memory, ratios."""
    drafter, target = prepare()
    out_dir = cache_dir() / "bench" / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    ours_out, theirs_out = out_dir / "ours.gguf", out_dir / "upstream.gguf"
    for p in (ours_out, theirs_out):
        p.unlink(missing_ok=True)
    script, gguf_py = upstream_converter()
    size = (drafter / "model.safetensors").stat().st_size
    progress(f"drafter: {size / 2**30:.2f} GiB bf16, hidden {HIDDEN}, {LAYERS} layers, ffn {FFN}, "
             f"{len(TARGET_LAYER_IDS)} taps; running the upstream converter")
    upstream = measure([sys.executable, str(script), str(drafter), "--target-model-dir", str(target),
                        "--outfile", str(theirs_out), "--outtype", "auto"],
                       env={**os.environ, "PYTHONPATH": str(gguf_py)}, cwd=script.parent)
    progress(f"upstream: {upstream['seconds']} s, {upstream['peak_mib']} MiB; running dflash-gguf convert")
    ours = measure([sys.executable, "-m", "dflash_gguf.cli", "convert", str(drafter), "--target", str(target),
                    "-o", str(ours_out)])
    progress(f"dflash-gguf: {ours['seconds']} s, {ours['peak_mib']} MiB; comparing the outputs")
    diffs = differences(ours_out, theirs_out)
    if not keep:
        for p in (ours_out, theirs_out):
            p.unlink(missing_ok=True)
    return {
        "drafter_bytes": size,
        "geometry": f"hidden {HIDDEN}, {LAYERS} layers, ffn {FFN}, {len(TARGET_LAYER_IDS)} taps",
        "upstream": upstream, "dflash_gguf": ours,
        "time_ratio": round(ours["seconds"] / upstream["seconds"], 3),
        "peak_memory_ratio": round(ours["peak_mib"] / upstream["peak_mib"], 3),
        "identical_output": not diffs, "differences": [str(d) for d in diffs[:10]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the two output files")
    args = parser.parse_args()

    result = compare(keep=args.keep)
    upstream, ours = result["upstream"], result["dflash_gguf"]
    print(f"{'':14}{'wall s':>10}{'peak MiB':>10}")
    print(f"{'upstream':14}{upstream['seconds']:>10.2f}{upstream['peak_mib']:>10.1f}")
    print(f"{'dflash-gguf':14}{ours['seconds']:>10.2f}{ours['peak_mib']:>10.1f}")
    print(f"ratio (ours / upstream): time {result['time_ratio']:.2f}x (goal <= 0.6x), "
          f"peak memory {result['peak_memory_ratio']:.2f}x (goal <= 0.35x)")
    print(f"identical output: {result['identical_output']}"
          + ("" if result["identical_output"] else f" ({result['differences'][:3]})"))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if not result["identical_output"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
