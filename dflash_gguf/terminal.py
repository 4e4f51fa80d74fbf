"""Terminal-safe text: values that come from files, shown escaped in human output.

A model card, a GGUF's metadata or a file name can hold control characters: an escape sequence
that clears the line, moves the cursor or recolours text could fake a "problems none found" or hide
an error. Human output (inspect, doctor, error lines) passes such values through `shown`, which
writes every control character (C0, DEL, C1, and the bidirectional overrides) as a visible escape.
JSON output is never escaped here: json.dumps already writes them as \\uXXXX, and the values stay
exact.
"""

from __future__ import annotations

import re

import click

# C0 controls but tab, DEL, C1 controls, the Unicode bidi embeddings / overrides / isolates, and lone
# surrogates (bytes of a non-UTF-8 file name or value, which no terminal encoding can write)
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(value: object) -> str:
    """`value` as text with no character that would act on a terminal."""
    return _CONTROL.sub(_escape, str(value))


def has_control(text: str) -> bool:
    return _CONTROL.search(text) is not None


def say(line: str, err: bool = False) -> None:
    """A line of human output (a command's progress, its "wrote ..." line), names and values from files
    shown escaped. JSON output is echoed as it is."""
    click.echo(shown(line), err=err)
