"""Drafter checkpoint + target -> the GGUF mainline llama.cpp expects, byte-compatible with upstream.

Everything is checked and planned first (metadata, tensor names, shapes, types); only then is the
file streamed out, tensor by tensor in row chunks, to a temporary file renamed into place.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import LlamaFileType as FT

from dflash_gguf.errors import CheckpointError
from dflash_gguf.gguf import config_values as cv
from dflash_gguf.gguf import layout
from dflash_gguf.gguf.checkpoint import Checkpoint, DrafterCheckpoint
from dflash_gguf.gguf.drafter_fit import DrafterFacts, check_dflash2_shapes, check_fits_target
from dflash_gguf.gguf.format import FileSpan, TensorInfo
from dflash_gguf.gguf.keys import ARCH, DFlash, General, Tokenizer
from dflash_gguf.gguf.quantized import FP8
from dflash_gguf.gguf.safetensors_file import StoredTensor, iter_row_chunks, iter_spans, to_float32
from dflash_gguf.gguf.target import TargetInfo, load_target
from dflash_gguf.gguf.writer import GGUFPlan, PlannedTensor, kv_from_writer, write_gguf
from dflash_gguf.hashing import hash_files
from dflash_gguf.hub import resolve as hub
from dflash_gguf.licenses import License, license_from_folder, with_override
from dflash_gguf.terminal import shown
from dflash_gguf.variants import architecture
from .mask_embedding import own_embeddings

log = logging.getLogger(__name__)

OUTTYPES = ("auto", "f32", "f16", "bf16", "q8_0")
_FILE_TYPES = {"f32": FT.ALL_F32, "f16": FT.MOSTLY_F16, "bf16": FT.MOSTLY_BF16, "q8_0": FT.MOSTLY_Q8_0}
_TENSOR_TYPES = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0}

Progress = Callable[[int, int, str], None]


@dataclass
class ConversionPlan:
    plan: GGUFPlan
    variant: str
    outtype: str
    warnings: list[str] = field(default_factory=list)
    drafter: Path | None = None        # the checkpoint folder read (a cache snapshot for a repo id)
    drafter_files: list = field(default_factory=list)  # confine.Opened: what was read, as it was read
    target: TargetInfo | None = None

    def provenance(self, hashes: bool = False) -> dict:
        """Where the drafter and the target were read: repository and commit, and for a GGUF read in
        place on the Hub, the bytes fetched against its metadata size. `hashes` adds each source
        file's sha256 (computed here; for a GGUF read in place, the Hub's)."""
        drafter = hub.cache_source(self.drafter) if self.drafter else None
        out = {"drafter": {"path": str(self.drafter), "repo": drafter.repo if drafter else None,
                           "revision": drafter.revision if drafter else None}}
        if hashes and self.drafter is not None:
            out["drafter"]["files"] = hash_files(self.drafter, self.drafter_files)
        if self.target is not None:
            t = self.target
            out["target"] = {"path": str(t.path), "repo": t.source.repo if t.source else None,
                             "revision": t.source.revision if t.source else None,
                             "file": t.source.file if t.source else None, **(t.fetched or {})}
            if hashes:
                folder = t.path if t.path.is_dir() else t.path.parent
                out["target"]["files"] = (hash_files(folder, t.files) if t.files
                                          else {t.source.file: t.source.sha256} if t.source else {})
        return out


def resolve_outtype(outtype: str, first_matrix_dtype: str | None) -> str:
    """`auto` follows the first matrix's dtype like upstream: BF16 -> bf16, anything else -> f16."""
    if outtype != "auto":
        return outtype
    return "bf16" if first_matrix_dtype == "BF16" else "f16"


def tensor_type(gguf_name: str, shape: tuple[int, ...], outtype: str) -> QT:
    """The GGML type upstream's converter gives this tensor under this outtype."""
    if layout.keeps_f32(gguf_name, len(shape)):
        return QT.F32
    qtype = _TENSOR_TYPES[outtype]
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    if shape[-1] % block:
        return QT.F16  # upstream falls back to F16 when rows do not split into quant blocks
    return qtype


def _bf16_bits_from_float64(values: np.ndarray) -> np.ndarray:
    """float64 -> bf16 rounded once, to nearest even: float32 rounded to odd keeps the sticky bit
    that a plain float32 step would lose (a float64 just above a bf16 tie would round down)."""
    f32 = values.astype(np.float32)
    too_far = np.abs(f32.astype(np.float64)) > np.abs(values)
    f32 = np.where(too_far, np.nextafter(f32, np.float32(0)), f32)
    bits = f32.view(np.uint32) | (f32.astype(np.float64) != values).astype(np.uint32)
    bits = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    return np.where(np.isnan(values), 0x7FC0, bits).astype(np.uint16)


def _encode_exact(values: np.ndarray, qtype: QT) -> np.ndarray:
    """Exact float64 values (dequantized FP8) in the GGML type, rounded once."""
    if qtype == QT.BF16:
        return _bf16_bits_from_float64(values)
    if qtype == QT.F16:
        return values.astype(np.float16)  # numpy rounds float64 -> float16 directly
    rows = values.astype(np.float32)
    return rows if qtype == QT.F32 else gguf.quants.quantize(rows, qtype)


def _encode_rows(raw: np.ndarray, src_dtype: str, qtype: QT) -> np.ndarray:
    if src_dtype == FP8:
        return _encode_exact(raw, qtype)
    if qtype == QT.BF16 and src_dtype == "BF16":
        # bf16 -> f32 -> bf16 is exact; upstream only changes signalling NaNs to quiet ones.
        nan = (raw & 0x7FFF) > 0x7F80
        return np.where(nan, raw | 0x0040, raw).astype(np.uint16) if nan.any() else raw
    rows = to_float32(raw, src_dtype)
    if qtype == QT.F32:
        return rows
    if qtype == QT.F16:
        return rows.astype(np.float16)
    return gguf.quants.quantize(rows, qtype)


def _neox_permutation(head_dim: int, n_rows: int) -> np.ndarray:
    """Row order turning interleaved-RoPE q/k rows into llama.cpp's NeoX layout, per head."""
    per_head = np.arange(head_dim).reshape(head_dim // 2, 2).T.reshape(-1)
    return (np.arange(0, n_rows, head_dim)[:, None] + per_head[None, :]).reshape(-1)


WEIGHT_DTYPES = ("BF16", "F16", "F32", "F64", FP8)  # what a weight may be stored as (BOOL/I64 masks are not)
_IDENTITY = {("BF16", QT.BF16), ("F16", QT.F16), ("F32", QT.F32)}


def _has_signalling_nan(bf16_bits: np.ndarray) -> bool:
    return bool(((bf16_bits & 0x7FFF) > 0x7F80).any())


def _verbatim(stored: StoredTensor) -> Iterator[FileSpan | np.ndarray]:
    """The stored bytes are already what upstream writes: let the kernel copy them. Only bf16 needs
    a look, for the rare signalling NaN that upstream turns quiet."""
    rewrite = _has_signalling_nan if stored.dtype == "BF16" else None
    for chunk in iter_spans(stored, rewrite):
        yield chunk if isinstance(chunk, FileSpan) else _encode_rows(chunk, "BF16", QT.BF16)


def _row_chunks(stored) -> Iterator[np.ndarray]:
    """Raw rows of a stored tensor, or the rows a derived source (FP8, patched embeddings) makes."""
    return iter_row_chunks(stored) if isinstance(stored, StoredTensor) else stored.iter_rows()


def _chunks(stored, qtype: QT, row_order: np.ndarray | None) -> Callable[[], Iterator]:
    def produce() -> Iterator[FileSpan | np.ndarray]:
        if row_order is None and isinstance(stored, StoredTensor) and (stored.dtype, qtype) in _IDENTITY:
            yield from _verbatim(stored)
        elif row_order is None:
            for raw in _row_chunks(stored):
                yield _encode_rows(raw, stored.dtype, qtype)
        else:  # small tensors only (q/k projections and norms): read whole, reorder rows
            whole = np.concatenate([c.reshape(-1) for c in _row_chunks(stored)])
            yield _encode_rows(whole.reshape(stored.shape[0], -1)[row_order], stored.dtype, qtype)
    return produce


def drafter_facts(ckpt: DrafterCheckpoint) -> DrafterFacts:
    return DrafterFacts(
        source=str(ckpt.config_path), hidden=ckpt.hidden_size, vocab=ckpt.vocab_size,
        target_layer_ids=tuple(ckpt.target_layer_ids), mask_token_id=ckpt.mask_token_id,
        conv_group_size=ckpt.conv[1] if ckpt.conv else None,
        selector_top_k=ckpt.selector[1] if ckpt.selector else None)


def _check_variant_settings(ckpt: DrafterCheckpoint) -> None:
    conv, selector = ckpt.conv, ckpt.selector  # each raises when only one of its pair is set
    if ckpt.variant == layout.DFLASH2 and not (conv and selector):
        missing = "conv_kernel_size/conv_group_size" if not conv else "selector_rank/selector_top_k"
        raise CheckpointError(f"{ckpt.config_path}: {architecture(layout.DFLASH2)} needs {missing}; add them to dflash_config")
    _check_attention_bias(ckpt)
    if ckpt.variant == layout.DSPARK:
        _check_dspark(ckpt)
    if ckpt.variant == layout.DFLASH and (conv or selector):
        raise CheckpointError(
            f"{ckpt.config_path}: {architecture(layout.DFLASH)} config sets DFlash 2 fields (conv/selector); "
            f"set architectures to {architecture(layout.DFLASH2)} or remove them")


def _check_dspark(ckpt: DrafterCheckpoint) -> None:
    if (head := ckpt.top("markov_head_type", "vanilla")) != "vanilla":
        raise CheckpointError(
            f"{ckpt.config_path}: markov_head_type {head!r}: llama.cpp runs only the 'vanilla' DSpark Markov head")
    if ckpt.draft_vocab_size < ckpt.vocab_size and "d2t" not in ckpt.tensors:
        raise CheckpointError(
            f"{ckpt.folder}: draft_vocab_size {ckpt.draft_vocab_size} < vocab_size {ckpt.vocab_size} but there is no "
            "d2t tensor mapping draft ids to target ids; the checkpoint is incomplete")


def _d2t_chunks(ckpt: DrafterCheckpoint) -> tuple[PlannedTensor, ...]:
    """DSpark's d2t (draft id -> offset to its target id) as absolute target ids, I64, as upstream writes it."""
    stored = ckpt.tensors.get("d2t")
    if ckpt.variant != layout.DSPARK or stored is None:
        return ()
    if stored.dtype not in ("I64", "I32"):
        raise CheckpointError(f"{stored.file}: tensor 'd2t' has dtype {stored.dtype}; expected integer offsets")
    offsets = np.concatenate([c.reshape(-1) for c in iter_row_chunks(stored)]).astype(np.int64)
    if offsets.size != ckpt.draft_vocab_size:
        raise CheckpointError(
            f"{stored.file}: d2t has {offsets.size} entries, draft_vocab_size is {ckpt.draft_vocab_size}; they must agree")
    ids = offsets + np.arange(offsets.size, dtype=np.int64)
    if ((ids < 0) | (ids >= ckpt.vocab_size)).any():
        raise CheckpointError(f"{stored.file}: d2t maps draft ids outside the target vocabulary 0..{ckpt.vocab_size - 1}")
    if np.unique(ids).size != ids.size:
        raise CheckpointError(f"{stored.file}: d2t maps two draft ids to the same target id")
    return (PlannedTensor(TensorInfo("d2t", (ids.size,), QT.I64), lambda: iter((ids,))),)


def _check_attention_bias(ckpt: DrafterCheckpoint) -> None:
    """q/k/v/o biases exactly when config.json says attention_bias (the reference builds them then)."""
    names = [rule.hf_name(i) for i in range(ckpt.n_layers) for rule in layout.ATTENTION_BIASES]
    present = [n for n in names if n in ckpt.tensors]
    if ckpt.top("attention_bias", False) and len(present) != len(names):
        missing = [n for n in names if n not in ckpt.tensors]
        raise CheckpointError(
            f"{ckpt.folder}: config.json sets attention_bias but tensor(s) {', '.join(missing[:4])} are missing; "
            "the checkpoint is incomplete")
    if present and not ckpt.top("attention_bias", False):
        raise CheckpointError(
            f"{ckpt.config_path}: the checkpoint has attention biases ({present[0]}, ...) but attention_bias is "
            "not true; set \"attention_bias\": true as the drafter was trained")


def match_tensors(ckpt: Checkpoint, variant: str, table: tuple[layout.TensorRule, ...] = layout.TENSORS,
                  ) -> list[tuple[str, StoredTensor, tuple[int, ...]]]:
    """(gguf name, stored tensor, expected shape) for every tensor; refuses missing or unexpected ones."""
    geometry = ckpt.geometry()
    stored = {n: t for n, t in ckpt.table_tensors.items() if not n.endswith(layout.IGNORED_HF_SUFFIXES)}
    expected = layout.expected_tensors(variant, ckpt.n_layers, table, present=set(stored))
    wanted = {rule.hf_name(bid) for rule, bid in expected}
    missing = [rule.hf_name(bid) for rule, bid in expected if rule.hf_name(bid) not in stored]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise CheckpointError(
            f"{ckpt.folder}: missing tensor(s) {', '.join(missing[:5])}{more} for a "
            f"{layout.VARIANT_NAMES.get(variant, variant)} model with {ckpt.n_layers} layers; the checkpoint is incomplete")
    unexpected = sorted(set(stored) - wanted)
    if unexpected:
        more = f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else ""
        raise CheckpointError(
            f"{ckpt.folder}: unexpected tensor(s) {', '.join(unexpected[:5])}{more}: not part of a "
            f"{layout.VARIANT_NAMES.get(variant, variant)} model with {ckpt.n_layers} layers "
            "(wrong architecture or num_hidden_layers?)")
    out = []
    for rule, bid in expected:
        t = stored[rule.hf_name(bid)]
        if t.dtype not in WEIGHT_DTYPES:
            raise CheckpointError(f"{t.file}: tensor {t.name!r} has dtype {t.dtype}; a weight is a float tensor "
                                  f"({', '.join(WEIGHT_DTYPES)}): the checkpoint is corrupt or not a drafter")
        shape = rule.shape(geometry)
        if t.shape != shape:
            raise CheckpointError(
                f"{t.file}: tensor {t.name!r} has shape {list(t.shape)}, expected {list(shape)} from config.json")
        out.append((rule.gguf_name(bid), t, shape))
    return out


def qwen3_hparams(ckpt: Checkpoint, arch: str, file_type: FT) -> tuple[gguf.GGUFWriter, dict]:
    """general.* and the Qwen3 hyperparameters, written through gguf-py as upstream's TextModel does;
    returns the writer and the rope parameters."""
    cfg, src = ckpt.config, ckpt.config_path
    w = gguf.GGUFWriter(path=None, arch=arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(shown(hub.folder_name(ckpt.folder)))  # a folder name that is not UTF-8 is written escaped
    w.add_block_count(ckpt.n_layers)
    if (n_ctx := ckpt.top("max_position_embeddings")) is not None:
        w.add_context_length(n_ctx)
    w.add_embedding_length(ckpt.hidden_size)
    w.add_feed_forward_length(ckpt.required("intermediate_size"))
    w.add_head_count(ckpt.required("num_attention_heads"))
    if (n_kv := ckpt.top("num_key_value_heads")) is not None:
        w.add_head_count_kv(n_kv)
    rope_key = "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
    rope = dict(cv.read(src, rope_key, cfg.get(rope_key), {}))

    def scaling(name: str, value=None):
        return cv.read(src, f"rope_scaling.{name}", rope.get(name) if value is None else value)

    scaling("factor")
    rope_type = scaling("rope_type", rope.get("rope_type") or rope.get("type"))
    if rope_type == "linear" and rope.get("factor") is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    elif rope_type == "yarn" and rope.get("factor") is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        orig = cv.read(src, "original_max_position_embeddings", rope.get(
            "original_max_position_embeddings", cfg.get("original_max_position_embeddings")))
        if orig is None:
            raise CheckpointError(f"{ckpt.config_path}: yarn rope scaling needs original_max_position_embeddings")
        w.add_rope_scaling_orig_ctx_len(orig)
        if (ext := scaling("extrapolation_factor")) is not None:
            w.add_rope_scaling_yarn_ext_factor(ext)
        if (attn := scaling("attention_factor", rope.get("attention_factor", rope.get("attn_factor")))) is not None:
            w.add_rope_scaling_yarn_attn_factor(attn)
        if (beta_fast := scaling("beta_fast")) is not None:
            w.add_rope_scaling_yarn_beta_fast(beta_fast)
        if (beta_slow := scaling("beta_slow")) is not None:
            w.add_rope_scaling_yarn_beta_slow(beta_slow)
    elif rope_type not in (None, "default"):
        raise CheckpointError(f"{ckpt.config_path}: rope type {rope_type!r} is not supported for DFlash drafters")
    # MoE-derived drafter configs (gpt-oss) keep the target's expert counts; upstream writes them
    if (n_expert := cv.read(src, "num_local_experts", cfg.get("num_local_experts", cfg.get("num_experts")))) is not None:
        w.add_expert_count(n_expert)
    if (n_used := cv.read(src, "num_experts_per_tok",
                          cfg.get("num_experts_per_tok", cfg.get("num_experts_per_token")))) is not None:
        w.add_expert_used_count(n_used)
    if (rope_theta := cv.read(src, "rope_theta", rope.get("rope_theta", cfg.get("rope_theta")))) is not None:
        w.add_rope_freq_base(rope_theta)
    if (eps := ckpt.top("rms_norm_eps")) is not None:
        w.add_layer_norm_rms_eps(eps)
    if (head_dim := ckpt.top("head_dim")) is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_file_type(file_type)
    return w, rope


def _dflash_metadata(ckpt: DrafterCheckpoint, target: TargetInfo, file_type: FT,
                     license: License | None) -> gguf.GGUFWriter:
    """The general.* and dflash.* keys, with names and types as upstream writes them."""
    cfg = ckpt.config
    w, rope = qwen3_hparams(ckpt, ARCH, file_type)
    if license is not None and license.id:
        w.add_license(license.id)
        if license.id == "other" and license.name:
            w.add_license_name(license.name)
        if license.id == "other" and license.link:
            w.add_license_link(license.link)
    _provenance(w, hub.cache_source(ckpt.folder), target)

    # DFlash-specific keys from the key table (PyPI gguf has no constants for them), mirroring upstream.
    partial = cv.read(ckpt.config_path, "partial_rotary_factor",
                      rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor")))
    if partial is not None:
        w.add_uint32(DFlash.ROPE_DIMENSION_COUNT, int(ckpt.head_dim * partial))
    if (value_scale := _finite(ckpt, "attention_value_scale", ckpt.dflash_config.get("attention_value_scale"))) is not None:
        w.add_float32(DFlash.VALUE_SCALE, float(value_scale))
    w.add_uint32(DFlash.BLOCK_SIZE, ckpt.block_size)
    if ckpt.conv and ckpt.selector:
        w.add_uint32(DFlash.CONV_KERNEL_SIZE, ckpt.conv[0])
        w.add_uint32(DFlash.CONV_GROUP_SIZE, ckpt.conv[1])
        w.add_uint32(DFlash.SELECTOR_RANK, ckpt.selector[0])
        w.add_uint32(DFlash.SELECTOR_TOP_K, ckpt.selector[1])
    if (multiplier := _finite(ckpt, "output_multiplier", ckpt.setting("output_multiplier"))) is not None:
        w.add_float32(DFlash.LOGIT_SCALE, float(multiplier))
    if (softcap := _finite(ckpt, "final_logit_softcapping", ckpt.setting("final_logit_softcapping"))) is not None \
            and softcap > 0:
        w.add_float32(DFlash.FINAL_LOGIT_SOFTCAPPING, float(softcap))
    if (embedding_scale := _finite(ckpt, "input_embedding_scale", ckpt.setting("input_embedding_scale"))) is not None:
        w.add_float32(DFlash.EMBEDDING_SCALE, float(embedding_scale))
    w.add_array(DFlash.TARGET_LAYERS, [i + 1 for i in ckpt.target_layer_ids])
    _sliding_window_metadata(ckpt, w)
    causal = ckpt.top("is_causal")
    if causal is None:
        causal = cv.read(ckpt.config_path, "dflash_config.causal", ckpt.dflash_config.get("causal"))
    if causal is not None:
        w.add_bool(DFlash.CAUSAL, bool(causal))
    if target.uses_mrope:
        w.add_array(DFlash.ROPE_DIMENSION_SECTIONS, [ckpt.head_dim // 2, 0, 0, 0])
    if ckpt.variant == layout.DSPARK:
        w.add_bool(DFlash.SAMPLE_FROM_ANCHOR, ckpt.sample_from_anchor)
        w.add_bool(DFlash.HAS_CONFIDENCE_HEAD, "confidence_head.proj.weight" in ckpt.tensors)
    return w


def _provenance(w: gguf.GGUFWriter, drafter: hub.HubSource | None, target: TargetInfo) -> None:
    """Where the drafter and the target were read: gguf-py's general.source.repo_url and
    general.base_model.0.*, and the exact Hub commit of each as `revision` beside them (gguf-py has
    no key for a commit; checkpoints change under the same name)."""
    if drafter is not None:
        w.add_string(General.SOURCE_REPO_URL, drafter.url)
        w.add_string(General.SOURCE_REVISION, drafter.revision)
    if target.source is None and not (target.name or target.repo):
        return
    w.add_uint32(General.BASE_MODEL_COUNT, 1)
    if target.source is not None:
        w.add_string(General.BASE_MODEL_NAME.format(id=0), target.name or target.source.repo)
        w.add_string(General.BASE_MODEL_REPO_URL.format(id=0), target.source.url)
        w.add_string(General.BASE_MODEL_REVISION.format(id=0), target.source.revision)
    else:
        w.add_string(General.BASE_MODEL_NAME.format(id=0), target.repo or target.name)
        if target.repo:
            url = target.repo if "://" in target.repo else f"https://huggingface.co/{target.repo}"
            w.add_string(General.BASE_MODEL_REPO_URL.format(id=0), url)


def _finite(ckpt: DrafterCheckpoint, name: str, value) -> float | None:
    return cv.read(ckpt.config_path, name, value)


def sliding_window(ckpt: DrafterCheckpoint) -> tuple[int, list[bool]] | None:
    """The checkpoint's attention window and which layers use it; None without sliding-window layers."""
    src = ckpt.config_path
    use_swa_everywhere = cv.read(src, "dflash_config.use_swa", ckpt.dflash_config.get("use_swa"), False)
    window = (cv.read(src, "dflash_config.swa_window_size", ckpt.dflash_config.get("swa_window_size"))
              or ckpt.top("sliding_window"))
    layer_types = ckpt.top("layer_types", [])
    wanted = ckpt.top("use_sliding_window") or use_swa_everywhere
    if wanted and window is None:
        field = "use_sliding_window" if ckpt.top("use_sliding_window") else "dflash_config.use_swa"
        raise CheckpointError(
            f"{shown(src)}: field {field!r} is true but no window size is given ('sliding_window' or "
            "'dflash_config.swa_window_size' is null or absent); give the window in tokens, or set "
            f"{field!r} to false for full attention")
    if not wanted:
        return None
    if use_swa_everywhere:
        return int(window), [True] * ckpt.n_layers
    if len(layer_types) != ckpt.n_layers:
        raise CheckpointError(
            f"{ckpt.config_path}: 'layer_types' has {len(layer_types)} entries for {ckpt.n_layers} layers; "
            "give one per layer")
    return int(window), [t == "sliding_attention" for t in layer_types]


def _sliding_window_metadata(ckpt: DrafterCheckpoint, w: gguf.GGUFWriter) -> None:
    found = sliding_window(ckpt)
    if found is not None:
        window, pattern = found
        w.add_uint32(DFlash.SLIDING_WINDOW, window)
        w.add_array(DFlash.SLIDING_WINDOW_PATTERN, pattern)


def plan_conversion(src: str | Path, target: str | Path | TargetInfo, outtype: str = "auto",
                    license_id: str | License | None = None) -> ConversionPlan:
    """Check everything and decide every byte's source, without writing."""
    if outtype not in OUTTYPES:
        raise CheckpointError(f"--outtype {outtype!r}: choose one of {', '.join(OUTTYPES)}")
    ckpt = DrafterCheckpoint(hub.drafter_folder(src))
    ckpt.architecture  # noqa: B018 - refuse unknown architectures first
    _check_variant_settings(ckpt)
    facts = drafter_facts(ckpt)
    check_dflash2_shapes(facts)
    tensors = match_tensors(ckpt, ckpt.variant)
    target_info = target if isinstance(target, TargetInfo) else load_target(target, ckpt.vocab_size)
    warnings = check_fits_target(facts, target_info)
    tensors = own_embeddings(ckpt, target_info.path) + tensors

    outtype = resolve_outtype(outtype, ckpt.first_matrix_dtype)
    writer = _dflash_metadata(ckpt, target_info, _FILE_TYPES[outtype], drafter_license(ckpt, license_id))
    plan = GGUFPlan()
    plan.add_kv(kv_from_writer(writer))
    plan.add_kv(target_info.tokenizer_kv)
    if ckpt.mask_token_id is not None:
        mask = gguf.GGUFWriter(path=None, arch=ARCH)
        mask.add_mask_token_id(ckpt.mask_token_id)
        plan.add_kv([kv for kv in kv_from_writer(mask) if kv.key == Tokenizer.MASK_ID])

    add_tensors(plan, tensors, outtype, ckpt)
    plan.tensors.extend(_d2t_chunks(ckpt))
    return ConversionPlan(plan, ckpt.variant, outtype, warnings, ckpt.folder, ckpt.sources(), target_info)


def add_tensors(plan: GGUFPlan, tensors: list[tuple[str, StoredTensor, tuple[int, ...]]], outtype: str,
                ckpt: Checkpoint) -> None:
    """Plan each matched tensor with the type upstream gives it and a producer of its bytes."""
    permute = not ckpt.top("rope_is_neox_style", True)
    rope_rows = ("attn_q.weight", "attn_k.weight", "attn_q_norm.weight", "attn_k_norm.weight")
    for gguf_name, stored, shape in tensors:
        qtype = tensor_type(gguf_name, shape, outtype)
        order = _neox_permutation(ckpt.head_dim, shape[0]) if permute and gguf_name.endswith(rope_rows) else None
        plan.tensors.append(PlannedTensor(TensorInfo(gguf_name, shape, qtype), _chunks(stored, qtype, order)))


def drafter_license(ckpt: DrafterCheckpoint, given: str | License | None) -> License | None:
    """What general.license says: the checkpoint folder's license (its card, or stricter terms in its
    license files), `--license` filling in one that is missing or unknown; a License object (from
    `release`, which has judged the terms already) is written as it is."""
    if isinstance(given, License):
        return given
    declared = license_from_folder(ckpt.folder)
    chosen = with_override(declared, given, "--license") if given else declared
    return chosen if chosen.id else None


def convert(src: str | Path, target: str | Path | TargetInfo, out: str | Path, outtype: str = "auto",
            license_id: str | License | None = None, progress: Progress | None = None) -> ConversionPlan:
    planned = plan_conversion(src, target, outtype, license_id)
    write_gguf(planned.plan, Path(out), progress)
    return planned
