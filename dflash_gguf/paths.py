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
