"""Compare two GGUF files the way the conformance tests need: metadata values+types and tensor bytes."""

from __future__ import annotations

from pathlib import Path

from dflash_gguf.gguf.file import GGUFFile

# general.* keys describe provenance (name, size label, our license/base model): not part of conformance.
IGNORED_PREFIXES = ("general.",)
COMPARED_GENERAL = ("general.architecture", "general.file_type", "general.alignment")


def compared_keys(f: GGUFFile) -> set[str]:
    return {k for k in f.kv if not k.startswith(IGNORED_PREFIXES) or k in COMPARED_GENERAL}


def differences(ours_path: Path, theirs_path: Path) -> list[str]:
    """Every way `ours` differs from `theirs`; empty means conformant."""
    diffs: list[str] = []
    with GGUFFile(ours_path) as ours, GGUFFile(theirs_path) as theirs:
        a, b = compared_keys(ours), compared_keys(theirs)
        diffs += [f"key only in ours: {k}" for k in sorted(a - b)]
        diffs += [f"key only in upstream: {k}" for k in sorted(b - a)]
        for k in sorted(a & b):
            x, y = ours.kv[k], theirs.kv[k]
            if (x.type, x.sub_type) != (y.type, y.sub_type):
                diffs.append(f"{k}: type {x.type.name}/{x.sub_type} != upstream {y.type.name}/{y.sub_type}")
            elif x.encoded() != y.encoded():
                diffs.append(f"{k}: value {str(x.value)[:80]} != upstream {str(y.value)[:80]}")
        ta, tb = set(ours.tensors), set(theirs.tensors)
        diffs += [f"tensor only in ours: {n}" for n in sorted(ta - tb)]
        diffs += [f"tensor only in upstream: {n}" for n in sorted(tb - ta)]
        for n in sorted(ta & tb):
            x, y = ours.tensors[n], theirs.tensors[n]
            if (x.shape, x.type) != (y.shape, y.type):
                diffs.append(f"{n}: {x.type.name}{list(x.shape)} != upstream {y.type.name}{list(y.shape)}")
            elif ours.tensor_bytes(n) != theirs.tensor_bytes(n):
                diffs.append(f"{n}: tensor bytes differ")
    return diffs
