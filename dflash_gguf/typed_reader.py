"""The one typed reader for values read from untrusted files (config.json, card front matter, GGUF
metadata, an index, quantization_config, pickled tensors).

Each field the code reads is declared once, as a `Field` with its kind and range, and read with
`Field.read(source, value)`: a value of the wrong type or out of range ends in one line naming the
file and the field, never a traceback nor a GGUF that llama.cpp then mishandles (a float size
truncated, "false" taken as true, NaN epsilons, an integer beyond what the GGUF field holds, a
string with a terminal escape in it):

    integers   never a bool, never a float such as 256.9; within [lo, hi], hi at most what the
               GGUF field holds (u32 unless declared otherwise)
    numbers    finite, within float32 (every float a GGUF here holds is f32)
    booleans   JSON/YAML true or false only: the string "false" is not false
    strings    text that encodes as UTF-8, without control characters, of bounded length
    lists      of one kind, of bounded length

The primitives (`integer`, `number`, ...) are the same rules for a value whose declaration is
computed (a range that depends on another field).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .errors import DflashError, InputError
from .terminal import has_control, shown

U32_MAX = (1 << 32) - 1
I32_MAX = (1 << 31) - 1
U64_MAX = (1 << 64) - 1
F32_MAX = 3.4028234663852886e38
MAX_STRING = 1 << 16
MAX_LIST = 1 << 16


def _fail(source: object, name: str, value: Any, want: str, error: type[DflashError]) -> DflashError:
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return error(f"{shown(source)}: field {name!r} = {shown(text)} is not {want}; fix it in the file")


def integer(source: object, name: str, value: Any, lo: int | None = 1, hi: int | None = U32_MAX,
            error: type[DflashError] = InputError) -> int:
    """An integer (never a bool, never a float such as 256.9) within [lo, hi]; hi defaults to what a
    GGUF u32 holds (None: no bound, for values no GGUF field receives)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(source, name, value, "an integer", error)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        span = f"from {lo}" if hi is None else f"from {lo} to {hi}" if lo is not None else f"at most {hi}"
        raise _fail(source, name, value, f"an integer {span}", error)
    return value


def number(source: object, name: str, value: Any, *, positive: bool = False, lo: float | None = None,
           hi: float | None = None, error: type[DflashError] = InputError) -> float:
    """A finite number within float32 (not a bool, not NaN or infinite), > 0 when `positive`, within [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(source, name, value, "a finite number", error)
    try:
        as_float = float(value)
    except OverflowError:
        raise _fail(source, name, value, "a finite number within float32", error) from None
    if not math.isfinite(as_float) or abs(as_float) > F32_MAX:
        raise _fail(source, name, value, "a finite number within float32", error)
    if positive and as_float <= 0:
        raise _fail(source, name, value, "a number above 0", error)
    if (lo is not None and as_float < lo) or (hi is not None and as_float > hi):
        raise _fail(source, name, value, f"a number from {lo} to {hi}", error)
    return as_float


def boolean(source: object, name: str, value: Any, error: type[DflashError] = InputError) -> bool:
    """true or false: the string "no" (or "false") is not false."""
    if not isinstance(value, bool):
        raise _fail(source, name, value, "true or false", error)
    return value


def string(source: object, name: str, value: Any, max_len: int = MAX_STRING, *, control_ok: bool = False,
           lines: bool = False, error: type[DflashError] = InputError) -> str:
    """Text that encodes as UTF-8, without control characters (unless `control_ok`; `lines`: but line
    breaks), at most `max_len` long."""
    if not isinstance(value, str):
        raise _fail(source, name, value, "a string", error)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _fail(source, name, value, "valid UTF-8 text", error) from None
    if len(value) > max_len:
        raise _fail(source, name, value, f"a string of at most {max_len} characters", error)
    if not control_ok and has_control(value.replace("\n", "") if lines else value):
        raise _fail(source, name, value, "text without control characters", error)
    return value


def choice(source: object, name: str, value: Any, choices: tuple[str, ...],
           error: type[DflashError] = InputError) -> str:
    """One of `choices`, exactly."""
    if not isinstance(value, str) or value not in choices:
        raise _fail(source, name, value, f"one of {', '.join(choices)}", error)
    return value


def mapping(source: object, name: str, value: Any, error: type[DflashError] = InputError) -> dict:
    """An object (a JSON object, a YAML mapping); null or absent gives {}."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(source, name, value, "a JSON object", error)
    return value


def string_list(source: object, name: str, value: Any, error: type[DflashError] = InputError,
                choices: tuple[str, ...] | None = None) -> list[str]:
    """A list of strings; each one of `choices` when given."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_LIST:
        raise _fail(source, name, value, "a list of strings", error)
    if choices is not None:
        return [choice(source, f"{name}[{i}]", v, choices, error) for i, v in enumerate(value)]
    return [string(source, f"{name}[{i}]", v, error=error) for i, v in enumerate(value)]


def integer_list(source: object, name: str, value: Any, lo: int | None = 0, hi: int | None = U32_MAX,
                 error: type[DflashError] = InputError) -> list[int]:
    if not isinstance(value, list) or not value or len(value) > MAX_LIST:
        raise _fail(source, name, value, "a non-empty list of integers", error)
    return [integer(source, f"{name}[{i}]", v, lo, hi, error) for i, v in enumerate(value)]


@dataclass(frozen=True)
class Field:
    """One field of an untrusted file, declared once: its kind and range.

    kind: "int", "float", "bool", "str", "object", "str-list", "int-list". For "float", `positive`
    and lo/hi; for ints, lo/hi (hi: what the GGUF field it goes to holds); for strings, `choices`
    when only those values have a meaning (anything else would be misread as one of them)."""

    name: str
    kind: str
    lo: float | None = None
    hi: float | None = None
    positive: bool = False
    gguf: str | None = None  # the GGUF key the value is written to, when there is one
    choices: tuple[str, ...] | None = None

    def read(self, source: object, value: Any, error: type[DflashError] = InputError,
             default: Any = None) -> Any:
        """`value` checked against the declaration (None, i.e. absent, gives `default`)."""
        if value is None:
            return default
        kind = self.kind
        if kind == "int":
            return integer(source, self.name, value, self.lo, self.hi, error)
        if kind == "float":
            return number(source, self.name, value, positive=self.positive, lo=self.lo, hi=self.hi, error=error)
        if kind == "bool":
            return boolean(source, self.name, value, error)
        if kind == "str":
            if self.choices is not None:
                return choice(source, self.name, value, self.choices, error)
            return string(source, self.name, value, int(self.hi or MAX_STRING), error=error)
        if kind == "object":
            return mapping(source, self.name, value, error)
        if kind == "str-list":
            return string_list(source, self.name, value, error, self.choices)
        if kind == "int-list":
            return integer_list(source, self.name, value, self.lo, self.hi, error)
        raise ValueError(f"field {self.name}: unknown kind {kind!r}")
