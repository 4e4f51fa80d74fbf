"""The one secret filter: no token reaches stdout, stderr, a log or a report, whatever a server echoes
or a file holds.

The command line (cli.py) writes everything a command says on stdout (what `inspect` shows of a
file included) and stderr (its error line, warnings, the log handler's records) through
`ScrubbingStream`, the log handler carries `ScrubbingFilter`, and
reports go through outputs.write_text, which scrubs too. What is replaced by `***`:

- the tokens huggingface_hub would send: HF_TOKEN (and the older HUGGING_FACE_HUB_TOKEN), and the stored
  login (`hf auth login`'s token file) once a command that needs a token has read it (`hub_token`, only
  when HF_TOKEN is unset) or an artifact is checked before it leaves: the file is local state, read
  without blocking and bounded, never by a command that neither sends a token nor writes an artifact;
- any `Authorization:` header value and any `Bearer ...` credential, whoever's it is;
- the user:password of any URL (`http://user:pass@host`), and HF_ENDPOINT's wherever they appear;
- anything shaped like a Hugging Face token (`hf_` and 30 or more letters and digits);
- the OIDC exchange's credentials (HF_OIDC_ID_TOKEN, ACTIONS_ID_TOKEN_REQUEST_TOKEN) and the access token
  it hands back (`register`, before anything can print it).

Each secret is known in every form a server can echo it in (`wire_forms`): as read, stripped, as
huggingface_hub sends it (CR/LF removed), URL-encoded, and as a header carries it. A token the filter
could not keep out of output (under 8 characters) or that no header can carry (not printable ASCII)
is refused before anything is sent, in one line naming where it came from (`check_sendable`).

A token is found in any case and with `_`, `-`, whitespace and `,` taken as one: a license id's
normalisation (lower case, `_` -> `-`) does not hide it. Artifacts (a GGUF's text, a release card, the
files `publish` sends) holding a token are refused, never scrubbed (`refuse_secrets`,
`refuse_secrets_in_file`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import string
from pathlib import Path
from typing import TextIO
from urllib.parse import quote, quote_plus, unquote, urlsplit
from .errors import InputError
from .errors import OutputError
from .inputs import read_text

MASK = "***"
_MIN_SECRET = 8  # a shorter value would mask ordinary words
_PATTERNS = (
    re.compile(r"(?i)(authorization\s*['\"]?\s*[:=]\s*['\"]?)(?:(?:bearer|basic|token)\s+)?[^\s'\",;)}\]]+"),
    re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{6,}"),
    re.compile(r"()\b[hH][fF][_-][A-Za-z0-9]{30,}"),
    re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://)[^\s/?#@]+(?=@)"),
)
# ASCII upper case to lower, and the separators a license id's normalisation rewrites to '-'. Length
# preserving, so a match's place in the folded text is its place in the original.
_SEPARATORS = "_, \t\n\r\f\v"
_FOLDED_FROM, _FOLDED_TO = string.ascii_uppercase + _SEPARATORS, string.ascii_lowercase + "-" * len(_SEPARATORS)
_FOLD_TEXT = str.maketrans(_FOLDED_FROM, _FOLDED_TO)
_FOLD_BYTES = bytes.maketrans(_FOLDED_FROM.encode(), _FOLDED_TO.encode())
_CHUNK = 16 << 20


TOKEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# Credentials of the OIDC exchange (HF_OIDC_RESOURCE): the CI's id token and what GitHub mints it with
CI_SECRET_ENV = ("HF_OIDC_ID_TOKEN", "ACTIONS_ID_TOKEN_REQUEST_TOKEN")
TOKEN_FILE_LIMIT = 1 << 16  # bytes: a token is some dozens
_stored: list[str] = []     # the stored login, once a command has read it (hub_token)
_registered: list[str] = []  # tokens the process was handed at run time (the OIDC exchange's)


def _token_file() -> Path:
    # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
    from huggingface_hub import constants

    return Path(constants.HF_TOKEN_PATH)


def stored_token() -> str | None:
    """The stored login (`hf auth login`'s token file), None when there is none. Read as untrusted local
    state, once: a regular file only, opened without blocking (a FIFO is refused, never waited on), at
    most TOKEN_FILE_LIMIT bytes of UTF-8; anything else is refused in one line naming the file."""

    if _stored:
        return _stored[0] or None
    path = _token_file()
    if not os.path.lexists(path):
        return None
    try:
        token = read_text(path, "token file (the stored Hugging Face login)", TOKEN_FILE_LIMIT).strip()
    except InputError as err:
        raise InputError(f"{err}; remove it and run `hf auth login` again, or set HF_TOKEN") from None
    _stored.append(token)
    if token:
        check_sendable(token, f"the token file {path}", "remove it and run `hf auth login` again, or set HF_TOKEN")
    return token or None


def sent_form(token: str) -> str:
    """A token as huggingface_hub sends it (`_clean_token`): CR and LF removed, then stripped."""
    return token.replace("\r", "").replace("\n", "").strip()


def check_sendable(token: str, where: str, fix: str) -> str:
    """`token` as it would be sent, refused (InputError, naming `where`, never the value) when the filter
    could not keep it out of output (under _MIN_SECRET characters) or no header can carry it (anything
    but visible ASCII and spaces)."""
    sent = sent_form(token)
    if len(sent) < _MIN_SECRET:
        raise InputError(f"{where}: the token is {len(sent)} characters, too short to keep out of every output "
                         f"(at least {_MIN_SECRET}); it is not sent: {fix}")
    if not all(" " <= c <= "~" for c in sent):
        raise InputError(f"{where}: the token holds a character outside printable ASCII, which no HTTP header "
                         f"can carry; it is not sent: {fix}")
    return sent


def register(token: str, where: str) -> str:
    """A token the process was handed at run time (the OIDC exchange's): checked as one about to be sent,
    then known to the filter before anything can print it."""
    if token not in _registered:
        _registered.append(token)  # first: the refusal below is printed through the filter too
    return check_sendable(token, where, "check HF_ENDPOINT and HF_OIDC_RESOURCE")


def hub_token() -> str | None:
    """The token huggingface_hub would send: HF_TOKEN (or the older HUGGING_FACE_HUB_TOKEN), else the
    stored login. Only a command that needs a token calls this: the token file is read then, never by
    a command that sends none (`--version` included)."""
    for name in TOKEN_ENV:
        if sent_form(os.environ.get(name, "")):
            return check_sendable(os.environ[name], name, f"set {name} to your whole token, or unset it")
    return stored_token()


def check_endpoint_credentials() -> None:
    """HF_ENDPOINT's user:password, refused (InputError) when the filter could not keep it out of output."""
    netloc = urlsplit(os.environ.get("HF_ENDPOINT", "").strip()).netloc
    userinfo = netloc.rpartition("@")[0]
    if userinfo:
        secret = unquote(userinfo.partition(":")[2] or userinfo)
        check_sendable(secret, "HF_ENDPOINT's credential (user:password@)", "use a longer one, or unset HF_ENDPOINT")


def _endpoint_credentials() -> list[str]:
    """HF_ENDPOINT's user:password and password, as written and URL-decoded (a server may echo either)."""
    netloc = urlsplit(os.environ.get("HF_ENDPOINT", "").strip()).netloc
    userinfo = netloc.rpartition("@")[0]
    if not userinfo:
        return []
    password = userinfo.partition(":")[2]
    return [userinfo, unquote(userinfo), password, unquote(password)]


def known_secrets(leaving: bool = False) -> list[str]:
    """The token values in play for this process, longest first: the environment's, and the stored login
    once a command has read it. `leaving`: for an artifact about to leave the process (a GGUF, a card,
    an upload), which must not hold the stored login either: the token file is read now if it can be
    (a file that cannot be read as one holds no token anyone sends)."""

    if leaving and not _stored:
        with contextlib.suppress(InputError):
            stored_token()
    values = ([os.environ.get(name, "") for name in TOKEN_ENV + CI_SECRET_ENV] + _endpoint_credentials()
              + _stored + _registered)
    forms = {form for value in values for form in wire_forms(value)}
    return sorted({v for v in forms if len(v) >= _MIN_SECRET}, key=len, reverse=True)


def wire_forms(secret: str) -> set[str]:
    """Every form a server can echo `secret` in: as read, stripped, as sent (CR/LF removed, stripped),
    URL-encoded (quote, quote_plus) and as a header carries it (Bearer <token>: the token itself; a
    header's bytes read back as latin-1)."""
    values = {secret, secret.strip(), sent_form(secret)}
    encoded = set()
    for value in values:
        encoded |= {quote(value, safe=""), quote(value), quote_plus(value)}
        with contextlib.suppress(UnicodeError):
            encoded.add(value.encode("utf-8").decode("latin-1"))
    return {v for v in values | encoded if v}


def _spans(text: str, secrets: list[str]) -> list[tuple[int, int]]:
    """Where each secret is in `text`, folded (any case, any separator), in order."""
    folded = text.translate(_FOLD_TEXT)
    found = []
    for secret in secrets:
        key = secret.translate(_FOLD_TEXT)
        start = folded.find(key)
        while start >= 0:
            found.append((start, start + len(key)))
            start = folded.find(key, start + len(key))
    return sorted(found)


def scrub(text: str, secrets: list[str] | None = None) -> str:
    """`text` with every token and credential replaced by ***."""
    spans = _spans(text, known_secrets() if secrets is None else secrets)
    if spans:
        parts, end = [], 0
        for start, stop in spans:
            if start >= end:
                parts += [text[end:start], MASK]
            end = max(end, stop)
        text = "".join(parts) + text[end:]
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + MASK, text)
    return text


def refuse_secrets(texts, where: object) -> None:
    """Refuse (OutputError) to write an artifact (a GGUF's text metadata, a release card) that holds a
    token of this process: an artifact is never scrubbed in silence, it is not written."""
    secrets = known_secrets(leaving=True)
    if not secrets:
        return
    for text in texts:
        if isinstance(text, str) and _spans(text, secrets):
            raise _carries(where, "would carry the Hugging Face token (HF_TOKEN or the stored login) found in an "
                                  "input's text; remove it from the input")


def refuse_secrets_in_file(opened, where: object) -> None:
    """As `refuse_secrets`, for every byte of a file the confined reader opened (confine.Opened), read
    through that open file: what `publish` sends is what was scanned."""
    keys = [secret.translate(_FOLD_TEXT).encode("utf-8") for secret in known_secrets(leaving=True)]
    if not keys:
        return
    overlap = max(map(len, keys)) - 1  # a token across two chunks
    offset, tail = 0, b""
    while chunk := opened.pread(_CHUNK, offset):
        offset += len(chunk)
        window = tail + chunk.translate(_FOLD_BYTES)
        if any(key in window for key in keys):
            raise _carries(where, "holds the Hugging Face token (HF_TOKEN or the stored login); it is not sent: "
                                  "remove the token from the file")
        tail = window[-overlap:] if overlap else b""


def _carries(where: object, why: str):

    return OutputError(f"{where}: {why}")


class ScrubbingStream:
    """A text stream that scrubs what is written to it (with the secrets known at each write: the stored
    login joins them when a command reads it)."""

    def __init__(self, inner: TextIO):
        self._inner = inner

    def write(self, text: str) -> int:
        self._inner.write(scrub(text) if isinstance(text, str) else text)
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
