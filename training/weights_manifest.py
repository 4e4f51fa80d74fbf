"""`python -m training.weights_manifest` (`make weights-manifest`): tests/fixtures/WEIGHTS.json, every
committed weights file with its size, its sha256 and, for a trained drafter, the figures its card held
when it was committed. Never written by hand: tests/house/test_weights.py fails while the tree and the
manifest differ, so a changed weights file shows in review as a manifest diff, beside its figures
(docs/testing.md#committed-weights: a retrain whose figures did not move is not committed).

The card of a drafter is, first found: trained.json's `held_out` block (the zoo), the README's
`held-out tau` row (SmolLM2's drafters), or its entry in ../reference_tau.json (the trained pair).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from dflash_gguf.hashing import sha256_file
from dflash_gguf.outputs import write_text

REPO = Path(__file__).resolve().parents[1]
MANIFEST = Path("tests/fixtures/WEIGHTS.json")
SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt")
# 117.6 MB were committed on 2026-12-06; the margin holds one more zoo family (dflash + dflash2,
# 5.3 MB) and a drafter growing by 2 MB. A new SmolLM2-sized drafter (16-20 MB) needs the budget
# raised in review, on purpose.
BUDGET_BYTES = 125_000_000
REGENERATE = "python -m training.weights_manifest"
_README_TAU = re.compile(r"^\| held-out tau \| \*\*([0-9.]+)\*\*", re.MULTILINE)


class WeightsError(Exception):
    """One line naming the file and the fix."""


def weights_files(repo: Path = REPO) -> list[str]:
    """Every weights file git tracks or would add (not ignored), present on disk, by path from `repo`."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True)
    if listed.returncode != 0:
        why = (listed.stderr.decode().strip().splitlines() or ["no output"])[-1]
        raise WeightsError(f"{repo}: git ls-files failed ({why}); run this inside the project's git checkout")
    return sorted({p for p in listed.stdout.decode().split("\0") if p.endswith(SUFFIXES) and (repo / p).is_file()})


def _is_drafter(folder: Path) -> bool:
    config = folder / "config.json"
    architectures = json.loads(config.read_text()).get("architectures", []) if config.is_file() else []
    return any(a.endswith("DraftModel") for a in architectures)


def _figures(folder: Path) -> tuple[Path, dict] | None:
    """(the card, its figures) for the drafter in `folder`, or None where it has no card."""
    trained, readme, reference = folder / "trained.json", folder / "README.md", folder.parent / "reference_tau.json"
    if trained.is_file():
        held = json.loads(trained.read_text())["held_out"]
        return trained, {"tau": held["tau"], "acceptance_rate": held["acceptance_rate"]}
    row = _README_TAU.search(readme.read_text()) if readme.is_file() else None
    if row:
        return readme, {"tau": float(row[1])}
    drafters = json.loads(reference.read_text()).get("drafters", {}) if reference.is_file() else {}
    if folder.name in drafters:
        return reference, {"tau": drafters[folder.name]["tau"]}
    return None


def card_figures(repo: Path, path: str) -> dict | None:
    """The figures of the drafter whose weights are `path`, with the card they were read from; None
    for a file that is no drafter (the trained pair's target)."""
    folder = (repo / path).parent
    try:
        found = _figures(folder)
    except (ValueError, KeyError, TypeError) as err:
        raise WeightsError(f"{path}: its card's figures cannot be read ({type(err).__name__}: {err}); "
                           "fix trained.json, README.md or ../reference_tau.json beside it") from None
    if found is None and _is_drafter(folder):
        raise WeightsError(f"{path}: a drafter without card figures (trained.json's held_out, the README's "
                           "held-out tau row or ../reference_tau.json): measure it before committing it")
    return None if found is None else {"card": found[0].relative_to(repo).as_posix(), **found[1]}


def entry(repo: Path, path: str) -> dict:
    return {"bytes": (repo / path).stat().st_size, "sha256": sha256_file(repo / path),
            "figures": card_figures(repo, path)}


def build(repo: Path = REPO) -> dict:
    files = {path: entry(repo, path) for path in weights_files(repo)}
    return {"about": f"every committed weights file; written by `{REGENERATE}`, never by hand "
                     "(docs/testing.md#committed-weights)",
            "total_bytes": sum(f["bytes"] for f in files.values()), "files": files}


def read(repo: Path = REPO) -> dict:
    path = repo / MANIFEST
    if not path.is_file():
        raise WeightsError(f"{MANIFEST}: missing; run `{REGENERATE}`")
    return json.loads(path.read_text())


def write(repo: Path = REPO) -> dict:
    manifest = build(repo)
    write_text(repo / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def verified(folder: Path, repo: Path = REPO) -> Path:
    """`folder` (a committed drafter or target), once each weights file in it has the size and sha256
    the manifest records; a file that differs, or is not recorded, is refused."""
    recorded = read(repo)["files"]
    for file in sorted(p for p in folder.iterdir() if p.name.endswith(SUFFIXES)):
        path = file.resolve().relative_to(repo.resolve()).as_posix()
        want = recorded.get(path)
        if want is None:
            raise WeightsError(f"{path} is not in {MANIFEST}: remove it, or to commit it (its card's figures "
                               f"measured) run `{REGENERATE}` and commit both")
        if file.stat().st_size != want["bytes"] or sha256_file(file) != want["sha256"]:
            raise WeightsError(f"{path} differs from what is recorded in {MANIFEST}: restore it (`git checkout "
                               f"-- {path}`), or for a retrain whose card figures moved run `{REGENERATE}` and "
                               "commit both")
    return folder


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    try:
        manifest = write(REPO)
    except (WeightsError, OSError) as err:
        print(f"weights_manifest: {err}", file=sys.stderr)
        return 2
    print(f"{MANIFEST}: {len(manifest['files'])} files, {manifest['total_bytes']:,} bytes "
          f"(budget {BUDGET_BYTES:,})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
