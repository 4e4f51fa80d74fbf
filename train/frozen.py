"""What a drafter borrows from its target, read from the target's GGUF: the token embedding, the output
head (the embedding again when tied) and the final norm, frozen, and for the families whose decoder
layers a DFlash layer can copy (llama, qwen3) the layers the drafter starts from.

The GGUF is read by the project's one reader (dflash_gguf/gguf/reader.py); tensors are dequantized to
float32 by gguf-py's quants (Q4_K_M, Q8_0, ...: the values llama.cpp computes with);
llama.cpp's converter permutes llama's q/k rows for its rope layout, so they are put back in
Hugging Face's order, which the drafter's attention expects.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from gguf.quants import dequantize
from torch import nn

from dflash_gguf.errors import TargetError
from dflash_gguf.gguf.keys import General, Model, Tokenizer, per_arch
from dflash_gguf.gguf.reader import GGUFFile

# families whose decoder layer is the drafter's (Qwen3 attention; llama's lacks the q/k norms)
COPYABLE = ("llama", "qwen3")
_PERMUTED = ("llama",)  # llama.cpp's converter permutes q/k rows for these


@dataclass(frozen=True)
class TargetShape:
    arch: str
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    rope_theta: float
    rms_eps: float
    n_ctx_train: int
    eos_token_id: int | None


def _unpermute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of llama.cpp's LlamaModel.permute (rows of each head: halves -> interleaved)."""
    rows = weights.shape[0]
    return (weights.reshape(n_head, rows // n_head // 2, 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


class GGUFWeights:
    """The target's tensors by GGUF name, dequantized to float32 on request."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.file = GGUFFile(self.path)
        self.shape = self._shape()

    def field(self, key: str, default=None):
        return self.file.get(key, default)

    def layer_value(self, key: str, default=None):
        """A hyperparameter that hybrid targets store once per layer (LFM2's head_count_kv is 0 on
        its convolution layers): the attention layers' value, the largest."""
        value = self.field(key, default)
        return max(value) if isinstance(value, list) and value else value

    def _need(self, key: str):
        value = self.field(key)
        if value is None:
            raise TargetError(f"{self.path}: key {key!r} is missing; re-convert the target with llama.cpp")
        return value

    def _shape(self) -> TargetShape:
        arch = self._need(General.ARCHITECTURE)
        key = lambda template: per_arch(template, arch)  # noqa: E731
        n_embd = int(self._need(key(Model.EMBEDDING_LENGTH)))
        n_head = int(self.layer_value(key(Model.HEAD_COUNT), self._need(key(Model.HEAD_COUNT))))
        return TargetShape(
            arch=arch, n_embd=n_embd, n_layer=int(self._need(key(Model.BLOCK_COUNT))), n_head=n_head,
            n_head_kv=int(self.layer_value(key(Model.HEAD_COUNT_KV), n_head)),
            head_dim=int(self.field(key(Model.KEY_LENGTH), n_embd // n_head)),
            # a target whose every FFN is a MoE (DeepSeek-V4) has only the experts' width
            n_ff=int(self.layer_value(key(Model.FEED_FORWARD_LENGTH))
                     or self.layer_value(key(Model.EXPERT_FEED_FORWARD_LENGTH))
                     or self._need(key(Model.FEED_FORWARD_LENGTH))),
            n_vocab=len(self._need(Tokenizer.TOKENS)),
            # stored as float32: their shortest decimals (9.9999997e-06 -> 1e-05), as config.json had them
            rope_theta=float(str(np.float32(self.field(key(Model.ROPE_FREQ_BASE), 10000.0)))),
            rms_eps=float(str(np.float32(self.field(key(Model.LAYERNORM_RMS_EPS), 1e-6)))),
            n_ctx_train=int(self.field(key(Model.CONTEXT_LENGTH), 4096)),
            eos_token_id=self.field(Tokenizer.EOS_ID))

    def has(self, name: str) -> bool:
        return name in self.file.tensors

    def get(self, name: str) -> torch.Tensor:
        info = self.file.tensors.get(name)
        if info is None:
            raise TargetError(f"{self.path}: tensor {name} is missing")
        data = dequantize(self.file.tensor_rows(name), info.type).astype(np.float32, copy=False).reshape(info.shape)
        if self.shape.arch in _PERMUTED and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = self.shape.n_head if name.endswith("attn_q.weight") else self.shape.n_head_kv
            data = _unpermute(data, heads)
        return torch.from_numpy(np.ascontiguousarray(data))


def _linear(weight: torch.Tensor, dtype) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=dtype)
    layer.weight.data = weight.to(dtype)
    return layer


def _norm(weight: torch.Tensor, eps: float) -> nn.RMSNorm:
    norm = nn.RMSNorm(weight.shape[0], eps=eps)
    norm.weight.data = weight.float()
    return norm


def _layer(weights: GGUFWeights, bid: int, dtype) -> SimpleNamespace:
    """Target layer `bid` under the Hugging Face names the recipe's init_from_target reads."""
    eps = weights.shape.rms_eps
    get = lambda name: weights.get(f"blk.{bid}.{name}.weight")  # noqa: E731
    attn = SimpleNamespace(**{f"{p}_proj": _linear(get(g), dtype) for p, g in
                              (("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v"), ("o", "attn_output"))})
    if weights.has(f"blk.{bid}.attn_q_norm.weight"):  # qwen3
        attn.q_norm, attn.k_norm = _norm(get("attn_q_norm"), eps), _norm(get("attn_k_norm"), eps)
    mlp = SimpleNamespace(gate_proj=_linear(get("ffn_gate"), dtype), up_proj=_linear(get("ffn_up"), dtype),
                          down_proj=_linear(get("ffn_down"), dtype))
    return SimpleNamespace(self_attn=attn, mlp=mlp, input_layernorm=_norm(get("attn_norm"), eps),
                           post_attention_layernorm=_norm(get("ffn_norm"), eps))


class FrozenTarget(nn.Module):
    """The borrowed parts as the recipe reads them (`get_input_embeddings()`, `lm_head`,
    `model.norm`, `model.layers[i]` for the layers asked for; the others are None)."""

    def __init__(self, weights: GGUFWeights, layers: range = range(0), dtype=torch.bfloat16):
        super().__init__()
        shape = weights.shape
        embedding = weights.get("token_embd.weight")
        self.embed_tokens = nn.Embedding.from_pretrained(embedding.to(dtype), freeze=True)
        head = weights.get("output.weight") if weights.has("output.weight") else embedding
        self.lm_head = _linear(head, dtype).requires_grad_(False)
        # LFM2 normalises its last hidden state with the norm llama.cpp names token_embd_norm
        final = "output_norm.weight" if weights.has("output_norm.weight") else "token_embd_norm.weight"
        norm = _norm(weights.get(final), shape.rms_eps)
        stack = [None] * shape.n_layer
        for bid in layers:
            stack[bid] = _layer(weights, bid, dtype)
        self.model = SimpleNamespace(norm=norm, layers=stack)
        self.shape = shape

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens
