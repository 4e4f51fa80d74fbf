"""Every GGUF metadata key dflash-gguf reads or writes, each spelled once.

In the manner of gguf-py's `constants.py`: nested classes of key strings. Standard keys are taken
from `gguf.Keys` (formatted for the `dflash` architecture where a key is per-architecture); the
DFlash keys that PyPI gguf 0.19 lacks are spelled here as the pinned llama.cpp reads them
(`src/llama-arch.cpp`, and `common/speculative.cpp` for `sample_from_anchor`). Every other module
names a key through this table, a per-architecture one through `per_arch` (tests/gguf/test_keys.py holds
it). One table sits below this one and cannot import it: the families' target keys
(dflash_gguf/families.py `TARGET_KEYS`), per-architecture names without their `{arch}.`, which
`doctor` puts in front of them.
"""

from __future__ import annotations

from gguf import Keys as _K

ARCH = "dflash"                # general.architecture of every mainline drafter (DFlash, DFlash 2, DSpark)
LEGACY_ARCH = "dflash-draft"   # the fork layout that mainline llama.cpp refuses


def per_arch(template: str, arch: str) -> str:
    """A per-architecture key (`gguf.Keys.LLM.*`, "{arch}.embedding_length") for `arch`."""
    return template.format(arch=arch)


def _dflash(template: str) -> str:
    return per_arch(template, ARCH)


class General:
    ARCHITECTURE = _K.General.ARCHITECTURE
    ALIGNMENT = _K.General.ALIGNMENT
    NAME = _K.General.NAME
    LICENSE = _K.General.LICENSE
    LICENSE_NAME = _K.General.LICENSE_NAME
    LICENSE_LINK = _K.General.LICENSE_LINK
    REPO_URL = _K.General.REPO_URL
    SOURCE_REPO_URL = _K.General.SOURCE_REPO_URL
    BASENAME = _K.General.BASENAME
    ORGANIZATION = _K.General.ORGANIZATION
    BASE_MODEL_COUNT = _K.General.BASE_MODEL_COUNT
    BASE_MODEL_NAME = _K.General.BASE_MODEL_NAME          # .format(id=0)
    BASE_MODEL_REPO_URL = _K.General.BASE_MODEL_REPO_URL  # .format(id=0)
    # The exact Hub commit read, beside gguf-py's repo_url keys (gguf-py has no key for a commit).
    SOURCE_REVISION = "general.source.revision"
    BASE_MODEL_REVISION = "general.base_model.{id}.revision"  # .format(id=0)


class Tokenizer:
    PREFIX = "tokenizer."  # every key of the target's tokenizer starts so; a drafter GGUF carries them all
    TOKENS = _K.Tokenizer.LIST
    TOKEN_TYPE = _K.Tokenizer.TOKEN_TYPE
    CHAT_TEMPLATE = _K.Tokenizer.CHAT_TEMPLATE
    MASK_ID = _K.Tokenizer.MASK_ID
    PAD_ID = _K.Tokenizer.PAD_ID
    BOS_ID = _K.Tokenizer.BOS_ID
    EOS_ID = _K.Tokenizer.EOS_ID
    EOT_ID = _K.Tokenizer.EOT_ID
    UNK_ID = _K.Tokenizer.UNK_ID
    MODEL = _K.Tokenizer.MODEL
    PRE = _K.Tokenizer.PRE
    # every special-token id (bos, eos, padding, fim_*, ...): llama.cpp reads each as a u32
    IDS = tuple(key for name, key in vars(_K.Tokenizer).items() if name.endswith("_ID"))


class Model:
    """Per-architecture keys read from a target GGUF: `per_arch(Model.X, arch)`."""

    EMBEDDING_LENGTH = _K.LLM.EMBEDDING_LENGTH
    BLOCK_COUNT = _K.LLM.BLOCK_COUNT
    VOCAB_SIZE = _K.LLM.VOCAB_SIZE
    FEED_FORWARD_LENGTH = _K.LLM.FEED_FORWARD_LENGTH
    EXPERT_FEED_FORWARD_LENGTH = _K.LLM.EXPERT_FEED_FORWARD_LENGTH
    CONTEXT_LENGTH = _K.LLM.CONTEXT_LENGTH
    HEAD_COUNT = _K.Attention.HEAD_COUNT
    HEAD_COUNT_KV = _K.Attention.HEAD_COUNT_KV
    KEY_LENGTH = _K.Attention.KEY_LENGTH
    LAYERNORM_RMS_EPS = _K.Attention.LAYERNORM_RMS_EPS
    ROPE_FREQ_BASE = _K.Rope.FREQ_BASE
    ROPE_DIMENSION_SECTIONS = _K.Rope.DIMENSION_SECTIONS


class DFlash:
    """The keys of a mainline drafter GGUF (pinned src/llama-arch.cpp, src/models/dflash.cpp)."""

    BLOCK_COUNT = _dflash(_K.LLM.BLOCK_COUNT)
    EMBEDDING_LENGTH = _dflash(_K.LLM.EMBEDDING_LENGTH)
    FEED_FORWARD_LENGTH = _dflash(_K.LLM.FEED_FORWARD_LENGTH)
    HEAD_COUNT = _dflash(_K.Attention.HEAD_COUNT)
    LAYERNORM_RMS_EPS = _dflash(_K.Attention.LAYERNORM_RMS_EPS)
    ROPE_FREQ_BASE = _dflash(_K.Rope.FREQ_BASE)
    TARGET_LAYERS = f"{ARCH}.target_layers"    # int32 array: HF target_layer_ids, each plus 1
    BLOCK_SIZE = f"{ARCH}.block_size"          # u32; llama.cpp assumes DEFAULT_BLOCK_SIZE without it
    # DFlash 2: all four or none
    CONV_KERNEL_SIZE = f"{ARCH}.conv_kernel_size"
    CONV_GROUP_SIZE = f"{ARCH}.conv_group_size"
    SELECTOR_RANK = f"{ARCH}.selector_rank"
    SELECTOR_TOP_K = f"{ARCH}.selector_top_k"
    LOGIT_SCALE = _dflash(_K.LLM.LOGIT_SCALE)
    FINAL_LOGIT_SOFTCAPPING = _dflash(_K.LLM.FINAL_LOGIT_SOFTCAPPING)
    EMBEDDING_SCALE = _dflash(_K.LLM.EMBEDDING_SCALE)
    VALUE_SCALE = f"{ARCH}.attention.value_scale"
    # sliding-window layers: both, or neither
    SLIDING_WINDOW = _dflash(_K.Attention.SLIDING_WINDOW)
    SLIDING_WINDOW_PATTERN = _dflash(_K.Attention.SLIDING_WINDOW_PATTERN)
    CAUSAL = _dflash(_K.Attention.CAUSAL)
    ROPE_DIMENSION_COUNT = _dflash(_K.Rope.DIMENSION_COUNT)
    ROPE_DIMENSION_SECTIONS = _dflash(_K.Rope.DIMENSION_SECTIONS)
    # DSpark: bool, default true (anchor-first block: a whole block of drafts)
    SAMPLE_FROM_ANCHOR = f"{ARCH}.sample_from_anchor"
    HAS_CONFIDENCE_HEAD = f"{ARCH}.has_confidence_head"  # DSpark: bool, the confidence head is present

    REQUIRED = (BLOCK_COUNT, EMBEDDING_LENGTH, FEED_FORWARD_LENGTH, HEAD_COUNT, LAYERNORM_RMS_EPS, TARGET_LAYERS)
    DFLASH2 = (CONV_KERNEL_SIZE, CONV_GROUP_SIZE, SELECTOR_RANK, SELECTOR_TOP_K)


class Legacy:
    """The fork layout (`general.architecture = dflash-draft`): hparams under `dflash-draft.`, the
    DFlash settings nested one level deeper, target layer ids in the HF numbering."""

    PREFIX = f"{LEGACY_ARCH}."
    NESTED = f"{LEGACY_ARCH}.dflash."
    EMBEDDING_LENGTH = per_arch(_K.LLM.EMBEDDING_LENGTH, LEGACY_ARCH)
    BLOCK_COUNT = per_arch(_K.LLM.BLOCK_COUNT, LEGACY_ARCH)
    BLOCK_SIZE = NESTED + "block_size"
    MASK_TOKEN_ID = NESTED + "mask_token_id"
    TARGET_LAYER_IDS = NESTED + "target_layer_ids"
    N_TARGET_FEATURES = NESTED + "n_target_features"


DEFAULT_BLOCK_SIZE = 16  # what llama.cpp assumes when dflash.block_size is absent (common/speculative.cpp)
