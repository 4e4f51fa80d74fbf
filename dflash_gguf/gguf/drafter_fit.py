"""Does a drafter fit a target? The rules llama.cpp needs, checked before anything is written or run.

The converter applies them to a checkpoint; `serve` and `validate` apply them to a GGUF pair.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CheckpointError, TargetError
from ..families import RECORDING_ARCHS, RECORDS_LAST_OUTPUT, UNSERVED
from .keys import General
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
    _check_recorded(facts, target)
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


def check_drafter(facts: DrafterFacts, target: TargetInfo) -> list[str]:
    """Every rule at once: the drafter's own DFlash 2 shapes, then its fit to the target (warnings back)."""
    check_dflash2_shapes(facts)
    return check_fits_target(facts, target)


def recorded_layers(arch: str | None, n_layer: int) -> int:
    """How many layers' outputs the target's llama.cpp graph records for a drafter to read: HF taps
    0..n-1 (llama.cpp's layers 1..n). A target known only by its Hugging Face folder (`arch` None)
    is taken as most architectures are: the last layer's output is not recorded."""
    if arch is not None and arch not in RECORDING_ARCHS:
        return 0
    return n_layer if arch in RECORDS_LAST_OUTPUT else n_layer - 1


def _check_recorded(facts: DrafterFacts, target: TargetInfo) -> None:
    """llama-server's own refusal (common_speculative_dflash_mismatch), made before anything runs."""
    arch = target.general.get(General.ARCHITECTURE)
    arch = arch if isinstance(arch, str) else None
    top = recorded_layers(arch, target.n_layer)
    graph = f"the {arch} graph" if arch else "the target's llama.cpp graph"
    if top == 0:
        why = f" ({UNSERVED[arch]})" if arch in UNSERVED else ""
        raise TargetError(f"{facts.source}: {graph} records no layer inputs{why}, so llama-server cannot feed a "
                          f"DFlash drafter from {target.path}; use a target of the architecture the drafter was "
                          "trained for")
    beyond = [i for i in facts.target_layer_ids if i >= top]
    if beyond:
        raise TargetError(
            f"{facts.source}: target_layer_ids {beyond} tap layer {beyond[0] + 1} (dflash.target_layers), the "
            f"output of the target's last layer, which {graph} does not record (it provides layers 1..{top}, "
            f"HF ids 0..{top - 1}; {target.path}); llama-server would refuse the pair: use a drafter whose "
            f"target_layer_ids stay within 0..{top - 1}")
