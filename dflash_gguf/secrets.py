"""The one secret filter: no token reaches stderr, a log or a report, whatever a server echoes.

The command line (cli.py) writes everything a command says on stderr (its error line, warnings,
the log handler's records) through `ScrubbingStream`, the log handler carries `ScrubbingFilter`, and
reports go through outputs.write_text, which scrubs too. What is replaced by `***`:

- the tokens huggingface_hub would send: HF_TOKEN (and the older HUGGING_FACE_HUB_TOKEN), the stored
  login (`hf auth login`'s token file and its stored tokens);
- any `Authorization:` header value and any `Bearer ...` credential, whoever's it is;
- anything shaped like a Hugging Face token (`hf_` and 30 or more letters and digits).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import TextIO

MASK = "***"
_MIN_SECRET = 8  # a shorter value would mask ordinary words
_PATTERNS = (
    re.compile(r"(?i)(authorization\s*['\"]?\s*[:=]\s*['\"]?)(?:(?:bearer|basic|token)\s+)?[^\s'\",;)}\]]+"),
    re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{6,}"),
    re.compile(r"()\bhf_[A-Za-z0-9]{30,}"),
)


def _stored_tokens() -> list[str]:
    """The stored login: huggingface_hub's token file and its stored tokens (read as the library does)."""
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - a base dependency
        return []
    found = []
    for path in (constants.HF_TOKEN_PATH, constants.HF_STORED_TOKENS_PATH):
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")[:1 << 16]
        except OSError:
            continue
        for line in text.splitlines():
            value = line.split("=", 1)[1] if "=" in line else line
            found.append(value.strip())
    return found


def known_secrets() -> list[str]:
    """The token values in play for this process, longest first."""
    values = [os.environ.get(name, "") for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")]
    values += _stored_tokens()
    return sorted({v for v in values if len(v) >= _MIN_SECRET}, key=len, reverse=True)


def scrub(text: str, secrets: list[str] | None = None) -> str:
    """`text` with every token and credential replaced by ***."""
    for secret in known_secrets() if secrets is None else secrets:
        text = text.replace(secret, MASK)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + MASK, text)
    return text


def refuse_secrets(texts, where: object) -> None:
    """Refuse (OutputError) to write an artifact (a GGUF's text metadata, a release card) that holds a
    token of this process: an artifact is never scrubbed in silence, it is not written."""
    from .errors import OutputError

    secrets = known_secrets()
    if not secrets:
        return
    for text in texts:
        if isinstance(text, str) and any(secret in text for secret in secrets):
            raise OutputError(f"{where}: would carry the Hugging Face token (HF_TOKEN or the stored login) "
                              "found in an input's text; remove it from the input")


class ScrubbingStream:
    """A text stream that scrubs what is written to it (the secrets are read once, when it is made)."""

    def __init__(self, inner: TextIO):
        self._inner = inner
        self._secrets = known_secrets()

    def write(self, text: str) -> int:
        self._inner.write(scrub(text, self._secrets) if isinstance(text, str) else text)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


class ScrubbingFilter(logging.Filter):
    """A log handler's filter: each record's message (arguments and traceback included) scrubbed."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.msg, record.args = scrub(message), None
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        return True


def filter_log_handlers(logger: logging.Logger | None = None) -> None:
    """Put ScrubbingFilter on every handler of `logger` (the root logger by default)."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, ScrubbingFilter) for f in handler.filters):
            handler.addFilter(ScrubbingFilter())
