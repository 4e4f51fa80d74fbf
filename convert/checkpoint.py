"""Hugging Face checkpoint folders (config.json plus safetensors, one file or sharded), read lazily:
the generic reader, and the z-lab drafter on top of it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, InputError
from ..inputs import load_json
from . import config_values as cv
from . import layout
from .quantized import FP8Weight, dequantized
from .safetensors_file import StoredTensor, read_header

INDEX_NAME = "model.safetensors.index.json"
MASK_EMBEDDING_NAME = "mask_embedding.pt"  # MiMo drafters' own mask embedding (mask_embedding.py)


def _load_json(path: Path) -> Any:
    try:
        return load_json(path, "config file")
    except InputError as err:
        raise CheckpointError(str(err)) from None


# Bounds no real drafter reaches; beyond them llama.cpp fails (bad_alloc) or the numbers are garbage.
MAX_SIZE = 1 << 20          # hidden, ffn, head counts
MAX_VOCAB = 1 << 24
MAX_BLOCK_SIZE = 1024       # block_size 0 or 1 drafts nothing; 10^9 made llama-server answer bad_alloc


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The reference's default taps when a config gives only `num_target_layers` (dflash/model.py)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + (i * (end - start)) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


@dataclass
class Checkpoint:
    folder: Path

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        if not self.folder.is_dir():
            raise CheckpointError(f"{self.folder}: not a folder (expected a checkpoint with config.json)")
        self.config_path = self.folder / "config.json"
        self.config: dict = _load_json(self.config_path)
        if not isinstance(self.config, dict):
            raise CheckpointError(f"{self.config_path}: expected a JSON object")

    def setting(self, name: str, default: Any = None) -> Any:
        return self.config.get(name, default)

    def required(self, name: str, hi: int = MAX_SIZE) -> int:
        """A positive integer setting that must be present."""
        value = self.setting(name)
        if value is None:
            raise CheckpointError(f"{self.config_path}: field {name!r} is missing; add it to config.json")
        return cv.integer(self.config_path, name, value, 1, hi)

    def optional(self, name: str, hi: int = MAX_SIZE) -> int | None:
        return cv.optional_integer(self.config_path, name, self.setting(name), 1, hi)

    @cached_property
    def hidden_size(self) -> int:
        return self.required("hidden_size")

    @cached_property
    def n_layers(self) -> int:
        n = self.required("num_hidden_layers")
        stored = len(self.tensors)
        if n > stored:  # every layer has tensors: bound the work by what the files hold
            raise CheckpointError(f"{self.config_path}: num_hidden_layers = {n}, but the checkpoint stores only "
                                  f"{stored} tensors; fix num_hidden_layers")
        return n

    @cached_property
    def vocab_size(self) -> int:
        return self.required("vocab_size", MAX_VOCAB)

    @cached_property
    def head_dim(self) -> int:
        return self.optional("head_dim") or max(1, self.hidden_size // self.required("num_attention_heads"))

    def geometry(self) -> layout.Geometry:
        n_head = self.required("num_attention_heads")
        return layout.Geometry(
            hidden=self.hidden_size, n_head=n_head,
            n_head_kv=self.optional("num_key_value_heads") or n_head, head_dim=self.head_dim,
            ffn=self.required("intermediate_size"), n_taps=0, vocab=self.vocab_size)

    # -- tensors ----------------------------------------------------------------------------------
    def tensor_name(self, stored_name: str) -> str:
        """The name the HF->GGUF table uses for a stored tensor."""
        return stored_name

    def _shard_files(self) -> list[Path]:
        index = self.folder / INDEX_NAME
        if index.is_file():
            weight_map = _load_json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(f"{index}: 'weight_map' is missing or empty")
            files = []
            for name in dict.fromkeys(weight_map.values()):
                path = self.folder / name
                if not path.is_file():
                    raise CheckpointError(f"{index}: shard {name!r} listed in weight_map is not in {self.folder}")
                files.append(path)
            return files
        files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{self.folder}: no .safetensors file (and no {INDEX_NAME})")
        return files

    def source_files(self) -> list[Path]:
        """Every file the checkpoint is read from: config.json, the index if any, the weights, the own
        mask embedding if any."""
        index, mask = self.folder / INDEX_NAME, self.folder / MASK_EMBEDDING_NAME
        return [self.config_path, *([index] if index.is_file() else []), *self._shard_files(),
                *([mask] if mask.is_file() else [])]

    @cached_property
    def stored_tensors(self) -> dict[str, StoredTensor]:
        """Every stored tensor by its table name, as stored; headers validated."""
        out: dict[str, StoredTensor] = {}
        for path in self._shard_files():
            for raw_name, t in read_header(path).items():
                name = self.tensor_name(raw_name)
                if name in out:
                    raise CheckpointError(f"{path}: tensor {raw_name!r} also appears in {out[name].file.name}")
                out[name] = t
        return out

    @cached_property
    def tensors(self) -> dict[str, StoredTensor | FP8Weight]:
        """The tensors the model is made of: an FP8 export's weights dequantized, its scales folded in."""
        return dequantized(self.stored_tensors, self.config, self.config_path)

    @property
    def table_tensors(self) -> dict:
        """The tensors the HF->GGUF table maps."""
        return self.tensors

    @cached_property
    def first_matrix_dtype(self) -> str | None:
        """What `--outtype auto` follows, as upstream: the first stored 2-D tensor in bf16 or f16."""
        for t in self.stored_tensors.values():
            if len(t.shape) >= 2 and t.dtype in ("BF16", "F16"):
                return t.dtype
        return None


class DrafterCheckpoint(Checkpoint):
    """A z-lab DFlash / DFlash 2 drafter: settings in `dflash_config` or at the top level."""

    def __post_init__(self) -> None:
        super().__post_init__()
        # EAGLE3-style exports (DSpark speculators) keep the layer settings in transformer_layer_config
        self.eagle3_style = "transformer_layer_config" in self.config or "aux_hidden_state_layer_ids" in self.config
        layer_config = cv.mapping(self.config_path, "transformer_layer_config", self.config.get("transformer_layer_config"))
        self.config = {**self.config, **layer_config}
        self.dflash_config: dict = cv.mapping(self.config_path, "dflash_config", self.config.get("dflash_config"))

    def setting(self, name: str, default: Any = None) -> Any:
        """A DFlash setting: `dflash_config[name]`, else the top-level field (the reference's rule)."""
        return self.dflash_config.get(name, self.config.get(name, default))

    def tensor_name(self, stored_name: str) -> str:
        return layout.normalize_hf_name(stored_name)

    @cached_property
    def architecture(self) -> str:
        archs = self.config.get("architectures") or []
        arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
        if arch not in layout.ARCHITECTURES:
            known = ", ".join(layout.ARCHITECTURES)
            raise CheckpointError(
                f"{self.config_path}: architectures = {archs!r} is not a DFlash drafter (expected one of {known})")
        return arch

    @cached_property
    def variant(self) -> str:
        return layout.ARCHITECTURES[self.architecture]

    @cached_property
    def block_size(self) -> int:
        return cv.integer(self.config_path, "block_size", self.setting("block_size", 16), 2, MAX_BLOCK_SIZE)

    @cached_property
    def mask_token_id(self) -> int | None:
        return cv.optional_integer(self.config_path, "mask_token_id", self.setting("mask_token_id"), 0, MAX_VOCAB)

    @cached_property
    def target_layer_ids(self) -> list[int]:
        ids = self.setting("target_layer_ids")
        aux = self.config.get("aux_hidden_state_layer_ids")
        if "dflash_config" not in self.config and aux is not None:
            # EAGLE3 numbering: hidden_states indices, i.e. target_layer_ids + 1
            if not isinstance(aux, list) or not aux or not all(isinstance(i, int) and i > 0 for i in aux):
                raise CheckpointError(f"{self.config_path}: 'aux_hidden_state_layer_ids' must be a non-empty list of positive integers")
            return [i - 1 for i in aux]
        if ids is None:
            if self.setting("num_target_layers") is None:
                raise CheckpointError(
                    f"{self.config_path}: neither 'target_layer_ids' nor 'num_target_layers' is set; "
                    "add the target layer ids the drafter was trained on")
            return build_target_layer_ids(self.required("num_target_layers"), self.n_layers)
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool)
                                                           and 0 <= i < MAX_SIZE for i in ids):
            raise CheckpointError(f"{self.config_path}: 'target_layer_ids' must be a non-empty list of layer "
                                  f"numbers (integers from 0), not {str(ids)[:60]}")
        if len(set(ids)) != len(ids):
            raise CheckpointError(f"{self.config_path}: 'target_layer_ids' {ids} names a layer twice")
        return ids

    def pair(self, first: str, second: str) -> tuple[int, int] | None:
        """Two settings that go together (DFlash 2's conv and selector): both, or neither."""
        a, b = self.setting(first), self.setting(second)
        if (a is None) != (b is None):
            given, missing = (first, second) if a is not None else (second, first)
            raise CheckpointError(
                f"{self.config_path}: {given!r} is set but {missing!r} is not; DFlash 2 needs both (or neither)")
        return None if a is None else (cv.integer(self.config_path, first, a), cv.integer(self.config_path, second, b))

    @cached_property
    def conv(self) -> tuple[int, int] | None:
        return self.pair("conv_kernel_size", "conv_group_size")

    @cached_property
    def selector(self) -> tuple[int, int] | None:
        return self.pair("selector_rank", "selector_top_k")

    # -- DSpark ----------------------------------------------------------------------------------
    @cached_property
    def draft_vocab_size(self) -> int:
        """Rows of a DSpark drafter's own vocabulary (its lm_head and markov_w2), d2t mapping them."""
        n = int(self.config.get("draft_vocab_size") or self.vocab_size)
        if n > self.vocab_size:
            raise CheckpointError(
                f"{self.config_path}: draft_vocab_size {n} exceeds vocab_size {self.vocab_size}; fix draft_vocab_size")
        return n

    @property
    def markov_rank(self) -> int:
        w1 = self.tensors.get("markov_head.markov_w1.weight")
        return w1.shape[-1] if w1 is not None and len(w1.shape) == 2 else 0

    @property
    def sample_from_anchor(self) -> bool:
        """DFlash-lineage DSpark samples from the anchor; EAGLE3-style exports use a bonus anchor slot."""
        return bool(self.config.get("sample_from_anchor", not self.eagle3_style))

    @cached_property
    def table_tensors(self):
        """The tensors the HF->GGUF table maps: without DSpark's d2t (written apart) and t2d (unused),
        nor the lm_head of a full-vocabulary DSpark drafter (llama.cpp borrows the target's)."""
        if self.variant != layout.DSPARK:
            return self.tensors
        drop = {"d2t", "t2d"} | ({"lm_head.weight"} if self.draft_vocab_size == self.vocab_size else set())
        return {n: t for n, t in self.tensors.items() if n not in drop}

    def geometry(self) -> layout.Geometry:
        kernel, group = self.conv or (0, 1)
        return dataclasses.replace(
            super().geometry(), n_taps=len(self.target_layer_ids), conv_kernel=kernel,
            conv_groups=self.hidden_size // group if group else 0, selector_rank=(self.selector or (0, 0))[0],
            markov_rank=self.markov_rank,
            draft_vocab=self.draft_vocab_size if self.variant == layout.DSPARK else 0)
