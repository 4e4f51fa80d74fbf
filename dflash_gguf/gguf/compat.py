"""Does a drafter fit a target? The rules llama.cpp needs, checked before anything is written or run.

The converter applies them to a checkpoint; `serve` and `validate` apply them to a GGUF pair.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CheckpointError, TargetError
from .target import TargetInfo


@dataclass(frozen=True)
class DrafterFacts:
    source: str  # the file the facts come from, for messages
    hidden: int
    vocab: int | None
    target_layer_ids: tuple[int, ...]  # HF numbering: tap = output of layer id (hidden_states[id + 1])
    mask_token_id: int | None
    conv_group_size: int | None = None
    selector_top_k: int | None = None


def check_dflash2_shapes(facts: DrafterFacts) -> None:
    """llama.cpp's loader refuses DFlash 2 files that break these (pinned src/models/dflash.cpp)."""
    if facts.conv_group_size is not None:
        if facts.conv_group_size <= 0 or facts.hidden % facts.conv_group_size:
            raise CheckpointError(
                f"{facts.source}: hidden size {facts.hidden} is not a multiple of conv_group_size "
                f"{facts.conv_group_size}; llama.cpp would refuse this DFlash 2 drafter")
    if facts.selector_top_k is not None:
        k = facts.selector_top_k
        if k <= 0 or facts.hidden < k * (k + 1):
            raise CheckpointError(
                f"{facts.source}: hidden size {facts.hidden} < selector_top_k*(selector_top_k+1) = {k * (k + 1)}; "
                "llama.cpp would refuse this DFlash 2 drafter")


def check_fits_target(facts: DrafterFacts, target: TargetInfo) -> list[str]:
    """Raise TargetError when the drafter cannot run with this target; return the warnings otherwise
    (the caller shows them: the library never prints, and a warning is said once)."""
    if facts.hidden != target.n_embd:
        raise TargetError(
            f"{facts.source}: drafter hidden size {facts.hidden} != target embedding length {target.n_embd} "
            f"({target.path}); this drafter was made for another target")
    bad = [i for i in facts.target_layer_ids if not 0 <= i < target.n_layer]
    if bad:
        raise TargetError(
            f"{facts.source}: target_layer_ids {bad} are outside the target's {target.n_layer} layers "
            f"(valid: 0..{target.n_layer - 1}, {target.path}); this drafter was made for a deeper target")
    if facts.vocab is not None and facts.vocab != target.n_vocab:
        raise TargetError(
            f"{facts.source}: drafter vocabulary size {facts.vocab} != target vocabulary size {target.n_vocab} "
            f"({target.path}); drafter and target must share one tokenizer")
    warnings: list[str] = []
    if facts.mask_token_id is not None:
        vocab = facts.vocab or target.n_vocab
        if not 0 <= facts.mask_token_id < vocab:
            raise CheckpointError(
                f"{facts.source}: mask_token_id {facts.mask_token_id} is outside the vocabulary (0..{vocab - 1}); "
                "set it to the id the drafter was trained with")
        if facts.mask_token_id == target.pad_token_id:
            warnings.append(
                f"{facts.source}: mask_token_id {facts.mask_token_id} is also the target's padding token; "
                "check that this is the id the drafter was trained with")
    return warnings
