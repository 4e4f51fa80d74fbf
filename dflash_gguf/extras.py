"""Optional parts of the install (pyproject's extras) and the one-line refusal when one is missing."""

from __future__ import annotations

import importlib.util

from .errors import MissingExtraError

# extra -> the modules it brings that the code imports
EXTRAS = {
    "reference": ("torch", "transformers", "dflash"),
    "train": ("torch", "transformers", "tokenizers"),
    "charts": ("matplotlib",),
}


def missing(extra: str) -> list[str]:
    return [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]


def require(extra: str, purpose: str) -> None:
    """Refuse `purpose` in one line naming the extra to install when any of its modules is absent."""
    absent = missing(extra)
    if absent:
        raise MissingExtraError(f"{purpose} needs the [{extra}] extra ({', '.join(absent)} not installed): "
                                f"pip install 'dflash-gguf[{extra}]'")
