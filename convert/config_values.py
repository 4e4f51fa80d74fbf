"""Type and range checks for values read from a config.json: every field is checked where it is read,
so a wrong type or an absurd value ends in one line naming the file and the field, never a traceback
nor a GGUF that llama.cpp then mishandles (a float size truncated, "no" taken as true, NaN epsilons)."""

from __future__ import annotations

import math
from typing import Any

from ..errors import CheckpointError, DflashError


def _fail(source: object, name: str, value: Any, want: str, error: type[DflashError]) -> DflashError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return error(f"{source}: field {name!r} = {shown} is not {want}; fix it in the config")


def integer(source: object, name: str, value: Any, lo: int | None = 1, hi: int | None = None,
            error: type[DflashError] = CheckpointError) -> int:
    """A JSON integer (never a bool, never a float such as 256.9) within [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(source, name, value, "an integer", error)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        span = f"from {lo}" if hi is None else f"from {lo} to {hi}" if lo is not None else f"at most {hi}"
        raise _fail(source, name, value, f"an integer {span}", error)
    return value


def optional_integer(source: object, name: str, value: Any, lo: int | None = 1, hi: int | None = None,
                     error: type[DflashError] = CheckpointError) -> int | None:
    return None if value is None else integer(source, name, value, lo, hi, error)


def number(source: object, name: str, value: Any, *, positive: bool = False, lo: float | None = None,
           hi: float | None = None, error: type[DflashError] = CheckpointError) -> float:
    """A finite JSON number (not a bool, not NaN or infinite), > 0 when `positive`, within [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(source, name, value, "a finite number", error)
    if positive and value <= 0:
        raise _fail(source, name, value, "a number above 0", error)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise _fail(source, name, value, f"a number from {lo} to {hi}", error)
    return float(value)


def optional_number(source: object, name: str, value: Any, **kwargs) -> float | None:
    return None if value is None else number(source, name, value, **kwargs)


def boolean(source: object, name: str, value: Any, error: type[DflashError] = CheckpointError) -> bool:
    """A JSON true/false: the string "no" is not false."""
    if not isinstance(value, bool):
        raise _fail(source, name, value, "true or false", error)
    return value


def optional_boolean(source: object, name: str, value: Any, error: type[DflashError] = CheckpointError) -> bool | None:
    return None if value is None else boolean(source, name, value, error)


def mapping(source: object, name: str, value: Any, error: type[DflashError] = CheckpointError) -> dict:
    """A JSON object; null or absent gives {}."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(source, name, value, "a JSON object", error)
    return value


def string_list(source: object, name: str, value: Any, error: type[DflashError] = CheckpointError) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(source, name, value, "a list of strings", error)
    return value
