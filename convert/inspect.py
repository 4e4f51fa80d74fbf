"""What a drafter GGUF is, and what is wrong with it, as a plain dict (the CLI prints it or its JSON)."""

from __future__ import annotations

from pathlib import Path

from . import layout
from .gguf_file import GGUFFile

# Keys mainline llama.cpp reads for every DFlash drafter (FACTS §2).
REQUIRED_KEYS = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                 "attention.layer_norm_rms_epsilon", "target_layers")
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def _variant(f: GGUFFile) -> str:
    if f.architecture == layout.LEGACY_ARCH:
        return layout.LEGACY
    for marker, variant in layout.VARIANT_MARKERS.items():
        if marker in f.tensors:
            return variant
    return layout.DFLASH


def inspect_gguf(path: str | Path) -> dict:
    with GGUFFile(path) as f:
        variant = _variant(f)
        problems: list[str] = []
        if f.architecture not in (layout.ARCH, layout.LEGACY_ARCH):
            problems.append(f"general.architecture is {f.architecture!r}: not a DFlash drafter")
        if variant == layout.LEGACY:
            a = layout.LEGACY_ARCH + ".dflash."
            block_size = f.get(a + "block_size")
            hf_ids = f.get(a + "target_layer_ids") or []
            mask = f.get(a + "mask_token_id")
            problems.append("legacy fork layout (dflash-draft): mainline llama.cpp refuses it; "
                            "migrate with `dflash-gguf convert FILE.gguf -o NEW.gguf`")
        else:
            a = layout.ARCH + "."
            block_size = f.get(a + "block_size")
            hf_ids = [i - 1 for i in f.get(a + "target_layers") or []]
            mask = f.get("tokenizer.ggml.mask_token_id")
            problems += [f"missing key {a}{k}" for k in REQUIRED_KEYS if a + k not in f.kv]
            if variant == layout.DFLASH2:
                present = [k for k in DFLASH2_KEYS if a + k in f.kv]
                if len(present) != len(DFLASH2_KEYS):
                    problems.append("DFlash 2 needs all of " + ", ".join(a + k for k in DFLASH2_KEYS)
                                    + f"; found {', '.join(present) or 'none'}")
            has_window = a + "attention.sliding_window" in f.kv
            has_pattern = a + "attention.sliding_window_pattern" in f.kv
            if has_window != has_pattern:
                problems.append("sliding-window layers without the window metadata: "
                                f"{a}attention.sliding_window and ...sliding_window_pattern must come together; re-convert")
            n_layers = f.get(a + "block_count")
            if n_layers is not None and variant in (layout.DFLASH, layout.DFLASH2):
                wanted = {rule.gguf_name(bid) for rule, bid in layout.expected_tensors(variant, int(n_layers))}
                missing = sorted(wanted - set(f.tensors))
                if missing:
                    problems.append(f"missing tensor(s): {', '.join(missing[:6])}" + (" ..." if len(missing) > 6 else ""))
        if "tokenizer.ggml.tokens" not in f.kv:
            problems.append("no tokenizer (tokenizer.ggml.tokens): re-convert with --target")
        n_vocab = len(f.get("tokenizer.ggml.tokens") or [])
        if mask is not None and n_vocab and not 0 <= mask < n_vocab:
            problems.append(f"mask token id {mask} is outside the vocabulary of {n_vocab}")

        tensors = [{"name": t.name, "type": t.type.name, "shape": list(t.shape), "bytes": t.nbytes}
                   for t in f.tensors.values()]
        by_type: dict[str, int] = {}
        for t in tensors:
            by_type[t["type"]] = by_type.get(t["type"], 0) + t["bytes"]
        return {
            "file": str(path),
            "architecture": f.architecture,
            "variant": layout.VARIANT_NAMES[variant],
            "block_size": int(block_size) if block_size is not None else None,
            "draft_length": int(block_size) - 1 if block_size is not None else None,
            "target_layers": {"hf": hf_ids, "llama_cpp": [i + 1 for i in hf_ids]},
            "mask_token_id": mask,
            "vocab_size": n_vocab or None,
            "sliding_window": f.get(a + "attention.sliding_window"),
            "sliding_window_pattern": f.get(a + "attention.sliding_window_pattern"),
            "causal": f.get(a + "attention.causal"),
            "license": f.get("general.license"),
            "tensor_count": len(tensors),
            "bytes_by_type": by_type,
            "tensors": tensors,
            "problems": problems,
        }
