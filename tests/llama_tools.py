"""Running llama.cpp's own programs the way a user does (always reaped), and reading the drafts
that ggml_patches/0003 logs at debug verbosity. The build itself is conftest's `llama_bin`."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dflash_gguf.runner.build import runtime_env



def run_tool(bin_dir: Path, tool: str, *args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run one llama.cpp program to its end; stdin is empty, output captured as text.
    A program still running after `timeout` seconds is killed and reported as exit status 124."""
    cmd = [str(bin_dir / tool), *map(str, args)]
    try:
        return subprocess.run(cmd, check=False, env=runtime_env(bin_dir), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return subprocess.CompletedProcess(cmd, 124, out, err + f"\n[killed after {timeout} s]\n")


# what ggml_patches/0003-dflash-log-drafts.patch logs at debug verbosity (-lv 5), one line per draft
DRAFT_LINE = re.compile(r"dflash draft: seq_id=(\d+) pos=(\d+) id_last=(\d+) n=(\d+) ids=\[([\d,]*)\]")


@dataclass(frozen=True)
class Draft:
    seq_id: int
    pos: int          # position of id_last, the block's first token
    id_last: int
    ids: list[int]    # what the drafter proposed


def parse_drafts(log: str) -> list[Draft]:
    drafts = []
    for match in DRAFT_LINE.finditer(log):
        seq_id, pos, id_last, n, ids = match.groups()
        tokens = [int(t) for t in ids.split(",") if t]
        assert len(tokens) == int(n), f"malformed draft line: {match.group(0)}"
        drafts.append(Draft(int(seq_id), int(pos), int(id_last), tokens))
    return drafts
