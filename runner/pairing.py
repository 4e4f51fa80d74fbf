"""Which drafter `serve` runs when none is named: the first compatible one found, never another.

Where it looks, in this order (what llama.cpp's `-hf` drafter discovery and the Hub's sidecar
releases put beside a target):

1. beside the target: `dflash-*.gguf` and `dspark-*.gguf` in the target's folder;
2. a target inside the Hugging Face cache (named as a Hub repo id, or its path there): the cached
   files of the folders above it in its repository (what `release --into` publishes as sidecars).
   Only what is already cached: nothing is downloaded without being asked;
3. the rest of the Hugging Face cache: drafter GGUFs whose file name names the target's model
   (`dflash-<Model>-<QUANT>.gguf` for `<Model>-<QUANT>.gguf`), in any cached repository.

In each place the drafter of the target's own quant comes first, then by name. Every candidate is
checked as `serve -d` checks a drafter (runner/launch.py check_pair: hidden size, taps and whether the
target's graph records them, vocabulary, mask token, DFlash 2 shapes); the first that fits is used,
and every other candidate is reported with why it was not.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from dflash_gguf.confined_reader import find_in
from dflash_gguf.errors import DflashError
from dflash_gguf.gguf import layout
from dflash_gguf.hub import cache as hub_cache
from dflash_gguf.hub import transport as hub_transport
from dflash_gguf.hub.names import QUANT_SUFFIX
from dflash_gguf.hub.resolve import cache_source
from .launch import check_pair

BESIDE = "beside the target"
CACHE_SCAN_LIMIT = 20_000  # entries of the Hugging Face cache looked at, at most (the scan is bounded)
CACHE_DEPTH = 4            # folders below a snapshot a drafter may lie in


@dataclass(frozen=True)
class Candidate:
    path: Path
    where: str  # BESIDE, "in <repo>'s cached files", "in the Hugging Face cache (<repo>)"


@dataclass
class Pairing:
    """What the search found: the drafter chosen (None: none fits) and why each other was passed over."""

    target: Path
    chosen: Candidate | None = None
    warnings: list[str] = field(default_factory=list)  # the chosen pair's check warnings
    skipped: list[tuple[Candidate, str]] = field(default_factory=list)

    def lines(self) -> list[str]:
        """One line for the drafter used (or for none), one per candidate passed over."""
        out = []
        if self.chosen is not None:
            out.append(f"drafter: {self.chosen.path} ({self.chosen.where}): it fits {self.target.name} "
                       "(hidden size, target layers, vocabulary, mask token)")
        for candidate, why in self.skipped:
            out.append(f"skipped drafter {candidate.path} ({candidate.where}): {why}")
        if self.chosen is None:
            looked = "none found" if not self.skipped else "none of them fits"
            out.append(f"no drafter for {self.target.name} ({looked} beside it or in the Hugging Face cache): "
                       "serving the target alone; give one with --draft")
        return out


def _model_name(stem: str) -> str:
    """A GGUF's model, as release file names spell it: the stem without its quant, lower case."""
    return (QUANT_SUFFIX.sub("", stem) or stem).lower()


def _quant(stem: str) -> str | None:
    m = QUANT_SUFFIX.search(stem)
    return m.group(1).upper() if m else None


def _drafter_model(name: str) -> str:
    """`dflash-SmolLM2-135M-F16.gguf` -> `smollm2-135m`."""
    stem = name[:-len(".gguf")]
    return _model_name(stem.split("-", 1)[1] if "-" in stem else stem)


def _ordered(target: Path, names: list[str]) -> list[str]:
    """The drafter of the target's quant first (as llama.cpp's -hf picks), then by name."""
    quant = _quant(target.stem)
    return sorted(names, key=lambda n: (_quant(n[:-len(".gguf")]) != quant, n))


def _drafters_in(folder: Path) -> list[str]:
    try:
        with os.scandir(folder) as entries:
            return [e.name for e in entries if layout.is_drafter_file(e.name)]
    except OSError:
        return []


def _beside(target: Path) -> list[Candidate]:
    folder = target.parent
    return [Candidate(folder / n, BESIDE) for n in _ordered(target, _drafters_in(folder))]


def _snapshot_of(target: Path) -> tuple[str, Path] | None:
    """(repo, snapshot folder) of a target inside the Hugging Face cache."""
    source = cache_source(target)
    if source is None:
        return None
    parts = Path(os.path.abspath(target)).parts
    i = parts.index(source.revision)
    return source.repo, Path(*parts[:i + 1])


def _repo_sidecars(target: Path) -> list[Candidate]:
    """The cached files of the folders above the target in its repository, deepest first."""
    found = _snapshot_of(target)
    if found is None:
        return []
    repo, snapshot = found
    out, folder = [], Path(os.path.abspath(target)).parent
    while folder != snapshot and snapshot in folder.parents:
        folder = folder.parent
        out += [Candidate(folder / n, f"in {repo}'s cached files") for n in _ordered(target, _drafters_in(folder))]
    return out


def _cache_drafters(target: Path) -> list[Candidate]:
    """Drafter GGUFs in any cached repository whose name names the target's model (a bounded scan)."""
    try:
        hub_transport.install()  # the Hub settings checked before huggingface_hub reads them
        root = hub_cache.cache_root()
        repos = sorted(e.name for e in os.scandir(root) if e.name.startswith("models--") and e.is_dir(follow_symlinks=False))
    except (OSError, DflashError):
        return []
    model, seen, out = _model_name(target.stem), 0, []
    for name in repos:
        snapshots = root / name / "snapshots"
        if os.path.islink(snapshots) or not snapshots.is_dir():
            continue
        repo = name[len("models--"):].replace("--", "/", 1)
        for top, dirs, files in os.walk(snapshots):  # os.walk does not follow links to folders
            seen += len(dirs) + len(files)
            if seen > CACHE_SCAN_LIMIT:
                return out
            if len(Path(top).relative_to(snapshots).parts) > CACHE_DEPTH:
                dirs[:] = []
            hits = [f for f in files if layout.is_drafter_file(f) and _drafter_model(f) == model]
            out += [Candidate(Path(top) / f, f"in the Hugging Face cache ({repo})") for f in _ordered(target, hits)]
    return out


def _confined(candidate: Candidate) -> None:
    """A drafter is read from its folder only when it lies there (a snapshot's link into its
    repository's blobs counts as its own): InputError otherwise."""
    opened = find_in(candidate.path.parent, candidate.path.name, "drafter")
    if opened is not None:
        opened.close()


def candidates(target: Path) -> list[Candidate]:
    """Every drafter file the search looks at, in the order it prefers them, each path once."""
    out, seen = [], set()
    for candidate in _beside(target) + _repo_sidecars(target) + _cache_drafters(target):
        key = os.path.realpath(candidate.path)
        if key not in seen and key != os.path.realpath(target):
            seen.add(key)
            out.append(candidate)
    return out


def find_drafter(target: Path) -> Pairing:
    """The first candidate that fits `target` (a local GGUF), and why every other one was passed over."""
    pairing = Pairing(target)
    for candidate in candidates(target):
        try:
            _confined(candidate)
            warnings = check_pair(target, candidate.path)
        except (DflashError, OSError) as err:
            pairing.skipped.append((candidate, _reason(err, candidate.path)))
            continue
        if pairing.chosen is None:
            pairing.chosen, pairing.warnings = candidate, list(warnings)
        else:
            pairing.skipped.append((candidate, f"it fits too, but {pairing.chosen.path.name} "
                                               f"({pairing.chosen.where}) comes first"))
    return pairing


def _reason(err: Exception, path: Path) -> str:
    """The check's one line without the file name the skip line already gives."""
    text = str(err) if isinstance(err, DflashError) else f"unreadable ({err.strerror or err})"
    for prefix in (f"{path}: ", f"{path.name}: "):
        if text.startswith(prefix):
            return text[len(prefix):]
    return text
