"""Hugging Face checkpoint folders (config.json plus safetensors, one file or sharded), read lazily:
the generic reader, and the z-lab drafter on top of it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from ..confined_reader import Opened, find_in, open_in, safe_name
from ..errors import CheckpointError, InputError
from ..inputs import parse_json
from ..terminal import shown
from . import config_values as cv
from . import layout
from .quantized import FP8Weight, dequantized
from .safetensors_file import MAX_TENSORS, StoredTensor, read_header

INDEX_NAME = "model.safetensors.index.json"
MAX_SHARDS = 1024
MASK_EMBEDDING_NAME = "mask_embedding.pt"  # MiMo drafters' own mask embedding (mask_embedding.py)


def _load_json(opened: Opened, what: str = "config file") -> Any:
    try:
        return parse_json(opened.read(what=what), opened.path)
    except InputError as err:
        raise CheckpointError(str(err)) from None


def _confined(folder: Path, name: str, what: str, required: bool = True) -> Opened | None:
    """folder/name through the confined reader, its refusals as CheckpointError."""
    try:
        return open_in(folder, name, what) if required else find_in(folder, name, what)
    except InputError as err:
        raise CheckpointError(str(err)) from None


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
            raise CheckpointError(f"{shown(self.folder)}: not a folder (expected a checkpoint with config.json)")
        self.config_path = self.folder / "config.json"
        self.config_file = _confined(self.folder, "config.json", "config file")
        self.config: dict = _load_json(self.config_file)
        if not isinstance(self.config, dict):
            raise CheckpointError(f"{shown(self.config_path)}: expected a JSON object")

    def setting(self, name: str, default: Any = None) -> Any:
        return self.config.get(name, default)

    def required(self, name: str) -> Any:
        """A declared setting (config_values.FIELDS) that must be present."""
        value = self.setting(name)
        if value is None:
            raise CheckpointError(f"{shown(self.config_path)}: field {name!r} is missing; add it to config.json")
        return cv.read(self.config_path, name, value)

    def optional(self, name: str, default: Any = None) -> Any:
        """A declared setting (config_values.FIELDS); `default` when absent."""
        return cv.read(self.config_path, name, self.setting(name), default)

    def top(self, name: str, default: Any = None) -> Any:
        """A declared top-level field of config.json (not looked up in dflash_config)."""
        return cv.read(self.config_path, name, self.config.get(name), default)

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
        return self.required("vocab_size")

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

    @cached_property
    def index_file(self) -> Opened | None:
        return _confined(self.folder, INDEX_NAME, "index file", required=False)

    @cached_property
    def shards(self) -> list[Opened]:
        """The safetensors files the weights are read from, opened: the index's shards (each a name
        inside the folder), else every *.safetensors at the folder's root."""
        index = self.index_file
        if index is not None:
            data = _load_json(index, "index file")
            weight_map = data.get("weight_map") if isinstance(data, dict) else None
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(f"{shown(index.path)}: 'weight_map' is missing or empty")
            try:  # each a plain name inside the folder, before anything is done with it
                names = list(dict.fromkeys(safe_name(v, index.path, "weight_map shard") for v in weight_map.values()))
            except InputError as err:
                raise CheckpointError(str(err)) from None
            if len(names) > MAX_SHARDS:
                raise CheckpointError(f"{shown(index.path)}: weight_map names {len(names)} shards, more than the "
                                      f"{MAX_SHARDS} a checkpoint is split into; fix the index")
            files = []
            for name in names:
                if not name.endswith(".safetensors"):
                    raise CheckpointError(f"{shown(index.path)}: weight_map shard {shown(repr(name)[:80])} is not a "
                                          ".safetensors file; the index names the checkpoint's own shards")
                opened = _confined(self.folder, name, "shard", required=False)
                if opened is None:
                    raise CheckpointError(f"{shown(index.path)}: shard {shown(repr(name))} listed in weight_map is "
                                          f"not in {shown(self.folder)}")
                files.append(opened)
            return files
        names = sorted(p.name for p in self.folder.glob("*.safetensors"))
        if not names:
            raise CheckpointError(f"{shown(self.folder)}: no .safetensors file (and no {INDEX_NAME})")
        return [_confined(self.folder, name, "safetensors file") for name in names]

    @cached_property
    def mask_file(self) -> Opened | None:
        return _confined(self.folder, MASK_EMBEDDING_NAME, "mask embedding", required=False)

    def sources(self) -> list[Opened]:
        """Every file the checkpoint is read from, as opened: config.json, the index if any, the
        weights, the own mask embedding if any (what provenance hashes)."""
        return [self.config_file, *([self.index_file] if self.index_file else []), *self.shards,
                *([self.mask_file] if self.mask_file else [])]

    def source_files(self) -> list[Path]:
        return [opened.path for opened in self.sources()]

    @cached_property
    def stored_tensors(self) -> dict[str, StoredTensor]:
        """Every stored tensor by its table name, as stored; headers validated."""
        out: dict[str, StoredTensor] = {}
        for shard in self.shards:
            found = read_header(shard)
            if len(out) + len(found) > MAX_TENSORS:  # the work is bounded by what the files hold, first
                raise CheckpointError(f"{shown(shard.path)}: the checkpoint holds more than {MAX_TENSORS} tensors; "
                                      "not a drafter or target checkpoint")
            for raw_name, t in found.items():
                name = self.tensor_name(raw_name)
                if name in out:
                    raise CheckpointError(f"{shown(shard.path)}: tensor {raw_name!r} also appears in "
                                          f"{shown(out[name].file.name)}")
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
        layer_config = cv.read(self.config_path, "transformer_layer_config", self.config.get("transformer_layer_config"), {})
        self.config = {**self.config, **layer_config}
        self.dflash_config: dict = cv.read(self.config_path, "dflash_config", self.config.get("dflash_config"), {})

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
            archs = shown(repr(archs)[:80])
            known = ", ".join(layout.ARCHITECTURES)
            raise CheckpointError(
                f"{shown(self.config_path)}: architectures = {archs} is not a DFlash drafter (expected one of {known})")
        return arch

    @cached_property
    def variant(self) -> str:
        return layout.ARCHITECTURES[self.architecture]

    @cached_property
    def block_size(self) -> int:
        return self.optional("block_size", 16)

    @cached_property
    def mask_token_id(self) -> int | None:
        return self.optional("mask_token_id")

    @cached_property
    def target_layer_ids(self) -> list[int]:
        ids = self.setting("target_layer_ids")
        aux = self.top("aux_hidden_state_layer_ids")
        if "dflash_config" not in self.config and aux is not None:
            return [i - 1 for i in aux]  # EAGLE3 numbering: hidden_states indices, i.e. target_layer_ids + 1
        if ids is None:
            if self.setting("num_target_layers") is None:
                raise CheckpointError(
                    f"{self.config_path}: neither 'target_layer_ids' nor 'num_target_layers' is set; "
                    "add the target layer ids the drafter was trained on")
            return build_target_layer_ids(self.required("num_target_layers"), self.n_layers)
        ids = self.optional("target_layer_ids")
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
        return None if a is None else (cv.read(self.config_path, first, a), cv.read(self.config_path, second, b))

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
        n = self.top("draft_vocab_size", self.vocab_size)
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
        return self.top("sample_from_anchor", not self.eagle3_style)

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
