"""The one assertion every refusal test makes: what a user sees when a command refuses its input.

Exit status 2; stderr is one line, starting `error: `, with no traceback and no Python exception class
name in it; it says each of the expected needles; the output named on the command line does not exist
afterwards and no hidden partial file is left beside it; the inputs are byte for byte as they were.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

EXCEPTION_CLASS = re.compile(r"\b(?:[A-Z][a-z0-9]+)+(?:Error|Exception)\b")


def snapshot(*paths: Path) -> dict[Path, str]:
    """Every file under `paths` with the sha256 of its bytes (what `assert_refused(untouched=...)` checks)."""
    files: dict[Path, str] = {}
    for root in map(Path, paths):
        for path in ([root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())):
            files[path] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def assert_refused(proc, *needles: str, out: Path | None = None, untouched: dict[Path, str] | None = None,
                   class_names: bool = False) -> str:
    """`proc` (a CompletedProcess or click Result) refused: see the module docstring. Returns the line.
    `class_names=True` allows a Python exception class name in the line (a test about one says so)."""
    stderr = proc.stderr
    assert proc.returncode == 2, (proc.returncode, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr, stderr
    assert class_names or not EXCEPTION_CLASS.search(stderr), stderr
    for needle in needles:
        assert needle in stderr, (needle, stderr)
    if out is not None:
        out = Path(out)
        assert not out.exists(), f"{out} was written by a refused command"
        if out.parent.is_dir():
            left = [p.name for p in out.parent.iterdir()
                    if p.name.startswith(".") and (out.name in p.name or p.name.endswith(".partial"))]
            assert left == [], f"partial files left beside {out}: {left}"
    if untouched is not None:
        changed = [str(p) for p, digest in untouched.items()
                   if not p.is_file() or hashlib.sha256(p.read_bytes()).hexdigest() != digest]
        assert changed == [], f"a refused command changed its inputs: {changed}"
    return lines[0]
