"""Where the project keeps slow-to-make things: outside the repository, shared by every checkout."""

import os
from pathlib import Path


def cache_dir() -> Path:
    """`$DFLASH_GGUF_CACHE`, else `$XDG_CACHE_HOME/dflash-gguf`, else `~/.cache/dflash-gguf`."""
    explicit = os.environ.get("DFLASH_GGUF_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "dflash-gguf"


def tuned_dir() -> Path:
    """Where `tune` keeps its results: `$DFLASH_GGUF_TUNED`, else `<cache_dir>/tuned` (the tests point
    it elsewhere, so a user's tuning never changes what their `serve` runs)."""
    explicit = os.environ.get("DFLASH_GGUF_TUNED")
    return Path(explicit) if explicit else cache_dir() / "tuned"
