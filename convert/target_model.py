"""Convert a Qwen3 *target* (Qwen3ForCausalLM) to GGUF: what `make fixtures` uses for the trained
pair, whose small BPE vocabulary the pinned upstream converter does not recognise by hash.

Same table, writer and tokenizer code as the drafter converter; the tests check it against the
pinned upstream converter (metadata and bytes) and against transformers' greedy tokens.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import CheckpointError
from ..gguf import layout
from ..gguf.checkpoint import Checkpoint
from ..gguf.file import GGUFPlan, kv_from_writer, write_gguf
from ..gguf.hf_vocab import tokenizer_metadata
from .converter import OUTTYPES, _FILE_TYPES, add_tensors, match_tensors, qwen3_hparams, resolve_outtype


def plan_target(src: str | Path, outtype: str = "auto") -> GGUFPlan:
    if outtype not in OUTTYPES:
        raise CheckpointError(f"--outtype {outtype!r}: choose one of {', '.join(OUTTYPES)}")
    ckpt = Checkpoint(Path(src))
    archs = ckpt.config.get("architectures") or []
    if archs[:1] != ["Qwen3ForCausalLM"]:
        raise CheckpointError(f"{ckpt.config_path}: architectures = {archs!r}; only Qwen3ForCausalLM targets convert here")
    tied = "lm_head.weight" not in ckpt.tensors
    variant = layout.QWEN3_TIED if tied else layout.QWEN3
    tensors = match_tensors(ckpt, variant, layout.TARGET_TENSORS)
    outtype = resolve_outtype(outtype, ckpt.first_matrix_dtype)
    writer, _ = qwen3_hparams(ckpt, layout.QWEN3, _FILE_TYPES[outtype])
    plan = GGUFPlan()
    plan.add_kv(kv_from_writer(writer))
    plan.add_kv(tokenizer_metadata(ckpt.folder, ckpt.vocab_size))
    add_tensors(plan, tensors, outtype, ckpt)
    return plan


def convert_target(src: str | Path, out: str | Path, outtype: str = "auto", progress=None) -> Path:
    write_gguf(plan_target(src, outtype), Path(out), progress)
    return Path(out)
