"""Tuned settings in the cache, one per (target file, drafter file, llama.cpp build, --exact), and
how `serve` applies one.

    <cache>/tuned/<key>.json     (paths.tuned_dir) `tune`'s result (runner/tune.py TuneResult.to_dict) plus the key parts

A file is known by its identity, not its path: its size and the sha256 of its first, middle and
last MiB (the GGUF header with its metadata, and tensor data), so a copy or a move keeps its
tuning while another model or quantization, even under the same name, does not, and a many-GB
target is not read whole at every `serve`. The build is the key of the patched build that ran
(runner/build.py; another build's folder name under --llama-bin). `--exact` (batch-invariant
verification, slower) is a setting of its own: a tuning measured with it is not applied without it,
nor the other way round.

Applying a result to serve's launch, the user's choices win: `--draft-max`, and `-t`,
`--spec-draft-n-max`, `--spec-draft-p-min` after `--`, are kept and only what the user left open
is taken from the tuning. When no drafting setting reached tune's minimum speedup, serve runs the
target alone (at the tuned thread count).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from dflash_gguf import typed_reader as values
from dflash_gguf.errors import DflashError
from dflash_gguf.inputs import parse_json, read_bytes
from dflash_gguf.options import AUTO
from dflash_gguf.outputs import write_text
from dflash_gguf.paths import tuned_dir
from .launch import parse_server_args
from .speed_verdict import speed_verdict
from .tune import P_MIN, THREADS, Setting

FORMAT = "dflash-gguf tuned setting"
VERSION = 1
_SAMPLE = 1 << 20


def file_identity(path: str | Path) -> str:
    """Size + sha256 of the first, middle and last MiB (the whole file when it is smaller)."""
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as fh:
        for offset in sorted({0, max(0, size // 2 - _SAMPLE // 2), max(0, size - _SAMPLE)}):
            fh.seek(offset)
            digest.update(fh.read(_SAMPLE))
    return f"{size}-{digest.hexdigest()[:32]}"


@dataclass(frozen=True)
class TuneKey:
    target: str   # file_identity of each
    draft: str
    build: str    # the llama.cpp build key
    exact: bool = False

    @classmethod
    def of(cls, target: str | Path, draft: str | Path, build: str, exact: bool = False) -> "TuneKey":
        return cls(file_identity(target), file_identity(draft), build, exact)

    def parts(self) -> dict:
        """The key as a record stores it (`exact` only when set: records from before it still match)."""
        return {"target": self.target, "draft": self.draft, "build": self.build, **({"exact": True} if self.exact else {})}

    def path(self) -> Path:
        words = f"{self.target}\0{self.draft}\0{self.build}" + ("\0exact" if self.exact else "")
        return tuned_dir() / f"{hashlib.sha256(words.encode()).hexdigest()[:24]}.json"


def save(key: TuneKey, result: dict) -> Path:
    """Write `result` (TuneResult.to_dict()) for `key`, whole or not at all; its path."""
    path = key.path()
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"format": FORMAT, "version": VERSION,
              "key": key.parts(), **result}
    write_text(path, json.dumps(record, indent=2) + "\n")
    return path


class UnreadableTuning(ValueError):
    """A file in the tuned folder that is not a record this version wrote (serve warns and ignores it)."""


RECORD_LIMIT = 4 << 20  # bytes: a record with every candidate tune measured is some kilobytes


def load(key: TuneKey) -> dict | None:
    """The record saved for `key`; None when there is none; UnreadableTuning when it is damaged or
    tampered with. Read as untrusted input: a regular file only (a FIFO is refused, not waited on),
    bounded in size and depth, and every value serve uses typed and ranged."""
    path = key.path()
    if not os.path.lexists(path):
        return None
    try:
        record = values.mapping(path, "record", parse_json(read_bytes(path, "tuned record", RECORD_LIMIT), path))
        if record.get("format") != FORMAT or record.get("version") != VERSION:
            raise UnreadableTuning(f"{path}: field 'format' is missing or not what `dflash-gguf tune` writes")
        if record.get("key") != key.parts():
            raise UnreadableTuning(f"{path}: field 'key' is missing or not what `dflash-gguf tune` writes")
        _check_fields(path, record)
    except DflashError as err:
        raise UnreadableTuning(str(err)) from None
    return record


def _check_fields(path: Path, record: dict) -> None:
    """Every value serve takes from a record, typed and ranged (InputError naming the field)."""
    Setting.from_dict(record.get("chosen"), path)
    values.boolean(path, "drafting_pays", record.get("drafting_pays"))
    if record.get("speedup") is not None:
        values.number(path, "speedup", record["speedup"], lo=0.0)
    if record.get("speedup_unreliable") is not None:
        values.string(path, "speedup_unreliable", record["speedup_unreliable"], 1024)
    settings = values.mapping(path, "settings", record.get("settings"))
    values.number(path, "settings.min_speedup", settings.get("min_speedup"), positive=True)
    best = values.mapping(path, "best_drafting", record.get("best_drafting"))
    for name, read in (("label", values.string), ("tau", values.number), ("pairs", values.integer)):
        if best.get(name) is not None:
            read(path, f"best_drafting.{name}", best[name])
    if record.get("finished_at") is not None:
        values.string(path, "finished_at", record["finished_at"], 64)


@dataclass(frozen=True)
class TunedServe:
    """What serve runs under a tuned record, after the user's own choices."""

    drafting: bool
    draft_max: int | None          # the launch's draft_max option
    server_args: tuple[str, ...]   # the tuned flags the user left open, then the user's own
    taken: tuple[str, ...]         # the tuned flags added (for the message)


def apply(record: dict, draft_max: int | None, server_args: Sequence[str]) -> TunedServe:
    """The launch options serve uses with `record`: the user's `--draft-max` and flags after `--` win."""
    chosen = Setting.from_dict(record["chosen"])
    given = parse_server_args(server_args)
    taken: list[str] = []
    if chosen.threads is not None and given.value_of(THREADS) is None:
        taken += ["-t", str(chosen.threads)]
    if chosen.drafting and chosen.p_min is not None and given.value_of(P_MIN) is None:
        taken += ["--spec-draft-p-min", f"{chosen.p_min:g}"]
    user_auto = AUTO in (draft_max, given.honoured.get("draft_max"))  # the controller does not verify trees
    if chosen.drafting and chosen.tree_budget and "tree_budget" not in given.honoured and not user_auto:
        taken += ["--spec-tree-budget", str(chosen.tree_budget)]
        if chosen.tree_p_min is not None and "tree_p_min" not in given.honoured:
            taken += ["--spec-tree-p-min", f"{chosen.tree_p_min:g}"]
    user_draft_max = draft_max is not None or "draft_max" in given.honoured
    tuned_draft_max = chosen.draft_max if chosen.drafting and not user_draft_max else None
    shown = taken + (["--spec-draft-n-max", str(tuned_draft_max)] if tuned_draft_max is not None else [])
    return TunedServe(drafting=chosen.drafting, draft_max=draft_max if draft_max is not None else tuned_draft_max,
                      server_args=(*taken, *server_args), taken=tuple(shown))


def describe_record(record: dict) -> str:
    """What the tuning measured, besides the speedup: the best drafting setting, tau, runs, date."""
    best = record.get("best_drafting") or {}
    tau = best.get("tau")
    return (f"at best {best.get('label', '?')}" + (f", tau {tau}" if tau is not None else "")
            + f"; median of {best.get('pairs', '?')} request pairs, tuned {record.get('finished_at', '?')}")


def announce(record: dict, applied: TunedServe, path: Path, target_name: str) -> str:
    """serve's line on stderr about a tuned record: what it takes from it, and the verdict, computed
    from the record's speedup and minimum, never from which setting was chosen."""
    verdict = speed_verdict(record["speedup"], record["settings"]["min_speedup"],
                            unreliable=record.get("speedup_unreliable"))
    taken = " ".join(applied.taken) or "nothing (your arguments set it all)"
    if applied.drafting:
        return f"tuned: {taken} from {path}: {verdict}; {describe_record(record)}; --no-tuned ignores it"
    return (f"tuned: {verdict}; {describe_record(record)} ({path}). Serving {target_name} WITHOUT the "
            f"drafter, {taken}; --no-tuned drafts anyway")

