"""The one reader of boolean settings from the environment: huggingface_hub's and the project's.

huggingface_hub reads its switches (constants.py, `_is_true`) as true when the value, upper-cased, is
exactly one of 1, ON, YES, TRUE, and as false otherwise: `HF_HUB_OFFLINE="1 "` or `=maybe` silently
mean online. Here a value is true as huggingface_hub reads it, false when unset, empty or one of 0,
OFF, NO, FALSE (any case), and anything else is refused in one line naming the variable, before
huggingface_hub is imported: the project and the library never disagree about a switch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .errors import OptionError
from .terminal import shown

TRUE = ("1", "ON", "YES", "TRUE")  # huggingface_hub's ENV_VARS_TRUE_VALUES
FALSE = ("", "0", "OFF", "NO", "FALSE")

# Every boolean the installed huggingface_hub (2.4) reads with `_is_true`
HUB_FLAGS = (
    "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY", "DISABLE_TELEMETRY", "DO_NOT_TRACK",
    "HF_HUB_DISABLE_UPDATE_CHECK", "HF_DEBUG", "HF_HUB_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_SYMLINKS",
    "HF_HUB_DISABLE_SYMLINKS_WARNING", "HF_HUB_DISABLE_EXPERIMENTAL_WARNING", "HF_HUB_DISABLE_IMPLICIT_TOKEN",
    "HF_XET_HIGH_PERFORMANCE", "HF_HUB_ENABLE_HF_TRANSFER", "HF_HUB_DISABLE_XET", "HF_HUB_DISABLE_SHARED_BLOBS",
    "HUGGINGFACE_CO_STAGING",
)


def flag(name: str, environ: Mapping[str, str] = os.environ) -> bool:
    """The boolean `name` of the environment, read as huggingface_hub reads it; an OptionError line
    naming the variable for a value that is neither true nor false."""
    value = environ.get(name)
    if value is None:
        return False
    if value.upper() in TRUE:
        return True
    if value.upper() in FALSE:
        return False
    raise OptionError(f"{name}={shown(repr(value[:40]))} is neither true ({', '.join(TRUE)}) nor false "
                      f"({', '.join(v for v in FALSE if v)} or empty); set one of those (no spaces) or unset it")


def check_flags(environ: Mapping[str, str] = os.environ) -> None:
    """Every boolean huggingface_hub reads, checked (before it is imported: it reads them then)."""
    for name in HUB_FLAGS:
        flag(name, environ)
