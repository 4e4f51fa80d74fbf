"""The z-lab PyTorch reference (PyPI `dflash==0.1.0`, extra `dflash-gguf[reference]`) run greedily
on given token ids: what acceptance a checkpoint has before any conversion. DSpark drafters, which
z-lab does not model, run on `dspark_reference` (the same DFlash layers plus the Markov head).

A conversion bug can keep llama.cpp's output exact while losing acceptance; comparing tau from
both sides on the same prompts shows it.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from dflash_gguf.confined_reader import find_in, open_in
from dflash_gguf.errors import InputError
from dflash_gguf.extras import require
from dflash_gguf.hashing import hash_files
from dflash_gguf.inputs import parse_json
from dflash_gguf.paths import cache_dir
from dflash_gguf.variants import ARCHITECTURES, VARIANTS, Variant

from .reference_target import for_generation, tap_like_llama

CACHE_FORMAT = 1  # bump when what a cached run holds changes


@dataclass
class ReferenceRun:
    tokens: list[int]  # new tokens, prompt excluded
    acceptance_lengths: list[int]  # tokens produced per target verification step, bonus included

    @property
    def tau(self) -> float:
        return sum(self.acceptance_lengths) / len(self.acceptance_lengths) if self.acceptance_lengths else 0.0


def use_cpu_clock() -> None:
    """`dflash_generate(return_stats=True)` times with torch.cuda.synchronize(); without CUDA, use
    the wall clock."""
    # extra: [reference] (PyTorch, transformers, the z-lab model)
    import torch
    from dflash import model as dflash_model

    if not torch.cuda.is_available():
        dflash_model._cuda_time = time.perf_counter


def _config(folder: Path, what: str) -> dict:
    opened = open_in(folder, "config.json", what)
    try:
        config = parse_json(opened.read(what=what), opened.path)
    finally:
        opened.close()
    return config if isinstance(config, dict) else {}


def drafter_class(draft_dir: Path):
    """The PyTorch class of a drafter folder, by its config.json's architecture (DFlash's when it names
    none the variant table knows)."""
    require("reference", "the z-lab PyTorch reference")
    config = _config(draft_dir, "drafter config")
    arch = (config.get("architectures") or [""])[0]
    return reference_class(ARCHITECTURES.get(arch, Variant.DFLASH))


def reference_class(variant: str):
    """The reference's class for a variant, as the variant table names it."""
    row = VARIANTS[variant]
    # extra: [reference] (PyTorch, transformers, the z-lab model)
    return getattr(importlib.import_module(row.reference_module), row.reference_class)


def _load(draft_dir: Path, target_dir: Path):
    # extra: [reference] (PyTorch, transformers, the z-lab model)
    import torch

    cls = drafter_class(draft_dir)
    target = load_target(target_dir, torch.float32)
    draft = cls.from_pretrained(str(draft_dir), torch_dtype=torch.float32).eval()
    return target, draft


def load_target(target_dir: Path, dtype):
    """The HF target, in eval mode, handing back its hidden states as llama.cpp taps them."""
    model = target_class(target_dir).from_pretrained(str(target_dir), dtype=dtype).eval()
    return tap_like_llama(model)


def target_class(target_dir: Path):
    """transformers' class that runs the target on text: its causal LM, or for a multimodal family with
    none (MuseGlimmer) the image-text-to-text model, which takes text alone and answers with the same
    logits and hidden states."""
    # extra: [reference] (PyTorch, transformers, the z-lab model)
    import transformers
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)

    model_type = _config(Path(target_dir), "target config").get("model_type")
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return AutoModelForCausalLM
    if model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return AutoModelForImageTextToText
    raise InputError(f"{Path(target_dir) / 'config.json'}: model_type {str(model_type)[:60]!r} has no causal-LM model in "
                     f"transformers {transformers.__version__}, so the PyTorch reference cannot run this target; "
                     "leave out --reference-draft/--reference-target")


def run_reference(draft_dir: str | Path, target_dir: str | Path, prompts: list[list[int]], n_new: int,
                  stop_token_ids: list[int] | None = None) -> list[ReferenceRun]:
    """Greedy speculative generation with the reference drafter, one run per prompt (token ids).
    The runs are deterministic on the CPU, so they are kept in the cache (`<cache>/reference/`),
    keyed by every byte of both folders, the prompts, the length and the library versions: a second
    `validate --reference-*` of the same pair costs the hashing only."""
    require("reference", "the z-lab PyTorch reference")
    key = _cache_key(Path(draft_dir), Path(target_dir), prompts, n_new, stop_token_ids)
    runs = _cached(key, len(prompts))
    if runs is None:
        target, draft = _load(Path(draft_dir), Path(target_dir))
        runs = speculative_runs(draft, target, prompts, n_new, stop_token_ids)
        _keep(key, runs)
    return runs


def _folder_digest(folder: Path) -> dict[str, str]:
    return hash_files(folder, sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")))


def _cache_key(draft_dir: Path, target_dir: Path, prompts, n_new: int, stop_token_ids) -> str:
    # extra: [reference] (PyTorch, transformers, the z-lab model)
    import torch  # the versions are part of what the runs depend on

    what = {"format": CACHE_FORMAT, "draft": _folder_digest(draft_dir), "target": _folder_digest(target_dir),
            "prompts": prompts, "n_new": n_new, "stop": stop_token_ids, "torch": torch.__version__,
            "transformers": metadata.version("transformers"), "dflash": metadata.version("dflash")}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def _cached(key: str, n_prompts: int) -> list[ReferenceRun] | None:
    """The kept runs, or None when there are none or the file is not what this module writes (the
    cache is local state anyone may have changed: read confined, bounded and typed, never trusted)."""
    opened = find_in(cache_dir() / "reference", f"{key}.json", "cached reference run")
    if opened is None:
        return None
    try:
        data = parse_json(opened.read(what="cached reference run"), opened.path)
    except InputError:
        return None
    finally:
        opened.close()
    ints = lambda v: isinstance(v, list) and all(type(x) is int and 0 <= x < 1 << 31 for x in v)  # noqa: E731
    if not (isinstance(data, list) and len(data) == n_prompts
            and all(isinstance(r, dict) and set(r) == {"tokens", "acceptance_lengths"}
                    and ints(r["tokens"]) and ints(r["acceptance_lengths"]) for r in data)):
        return None
    return [ReferenceRun(**r) for r in data]


def _keep(key: str, runs: list[ReferenceRun]) -> None:
    folder = cache_dir() / "reference"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{key}.{os.getpid()}.partial"
        tmp.write_text(json.dumps([asdict(r) for r in runs]))
        os.replace(tmp, folder / f"{key}.json")
    except OSError:
        pass  # a cache that cannot be written costs the next run its time, nothing else


def speculative_runs(draft, target, prompts: list[list[int]], n_new: int,
                     stop_token_ids: list[int] | None = None) -> list[ReferenceRun]:
    """The same, with the reference models already loaded."""
    # extra: [reference] (PyTorch, transformers, the z-lab model)
    import torch
    from dflash import model as dflash_model

    # extra: [reference] (PyTorch, transformers, the z-lab model)
    from .dspark_reference import DSparkDraftModel, dspark_generate

    use_cpu_clock()
    target = for_generation(target)
    runs = []
    with torch.inference_mode():
        for ids in prompts:
            input_ids = torch.tensor([ids], dtype=torch.long)
            if isinstance(draft, DSparkDraftModel):
                out = dspark_generate(draft, target, input_ids, n_new, stop_token_ids)
            else:
                out = dflash_model.dflash_generate(
                    draft, target=target, input_ids=input_ids, max_new_tokens=n_new,
                    stop_token_ids=stop_token_ids, temperature=0.0, return_stats=True)
            new = out.output_ids[0, out.num_input_tokens:].tolist()
            runs.append(ReferenceRun(tokens=new, acceptance_lengths=list(out.acceptance_lengths)))
    return runs
