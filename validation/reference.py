"""The z-lab PyTorch reference (PyPI `dflash==0.1.0`, extra `dflash-gguf[reference]`) run greedily
on given token ids: what acceptance a checkpoint has before any conversion. DSpark drafters, which
z-lab does not model, run on `dspark_reference` (the same DFlash layers plus the Markov head).

A conversion bug can keep llama.cpp's output exact while losing acceptance; comparing tau from
both sides on the same prompts shows it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..confine import open_in
from ..convert import layout
from ..extras import require
from ..inputs import parse_json


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
    import torch
    from dflash import model as dflash_model

    if not torch.cuda.is_available():
        dflash_model._cuda_time = time.perf_counter


def drafter_class(draft_dir: Path):
    """The PyTorch class of a drafter folder, by its config.json's architecture."""
    require("reference", "the z-lab PyTorch reference")
    from dflash import model as dflash_model

    opened = open_in(draft_dir, "config.json", "drafter config")
    try:
        config = parse_json(opened.read(what="drafter config"), opened.path)
    finally:
        opened.close()
    arch = ((config.get("architectures") if isinstance(config, dict) else None) or [""])[0]
    if layout.ARCHITECTURES.get(arch) == layout.DSPARK:
        from .dspark_reference import DSparkDraftModel
        return DSparkDraftModel
    return dflash_model.DFlash2DraftModel if arch == "DFlash2DraftModel" else dflash_model.DFlashDraftModel


def _load(draft_dir: Path, target_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM

    cls = drafter_class(draft_dir)
    target = AutoModelForCausalLM.from_pretrained(str(target_dir), torch_dtype=torch.float32).eval()
    draft = cls.from_pretrained(str(draft_dir), torch_dtype=torch.float32).eval()
    return target, draft


def run_reference(draft_dir: str | Path, target_dir: str | Path, prompts: list[list[int]], n_new: int,
                  stop_token_ids: list[int] | None = None) -> list[ReferenceRun]:
    """Greedy speculative generation with the reference drafter, one run per prompt (token ids)."""
    target, draft = _load(Path(draft_dir), Path(target_dir))
    return speculative_runs(draft, target, prompts, n_new, stop_token_ids)


def speculative_runs(draft, target, prompts: list[list[int]], n_new: int,
                     stop_token_ids: list[int] | None = None) -> list[ReferenceRun]:
    """The same, with the reference models already loaded."""
    import torch
    from dflash import model as dflash_model

    from .dspark_reference import DSparkDraftModel, dspark_generate

    use_cpu_clock()
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
