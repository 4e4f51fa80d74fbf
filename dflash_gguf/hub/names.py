"""What the Hugging Face Hub accepts as a repository id, a revision and a commit id, in one place.

    repo id     OWNER/NAME, each part 1-96 ASCII letters, digits, '-', '_', '.'; starting and ending
                with a letter or digit; no '--' nor '..' anywhere; NAME not ending in '.git'
    revision    a branch or tag of the same characters (no '..', not starting with '-' or '.', not
                ending with '.' or '.lock'), `refs/pr/N`, or a commit id
    commit id   40 lower-case hex digits

Only ASCII counts: Python's `\\w` and str.isdigit also take a Cyrillic 'е', '²' or '٣', which the Hub
refuses and which would name another repository to a reader's eye.
"""

from __future__ import annotations

import re

from ..errors import DflashError, InputError
from ..terminal import shown

_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?", re.ASCII)
_BRANCH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}", re.ASCII)
_PULL_REQUEST = re.compile(r"refs/pr/[1-9][0-9]{0,8}", re.ASCII)
COMMIT = re.compile(r"[0-9a-f]{40}", re.ASCII)
# A GGUF file name's quantization suffix (`-Q4_K_M`, `.F16`): how a repository's files of one model
# tell their quants apart, and what `dflash-<Model>-<QUANT>.gguf` ends with.
QUANT_SUFFIX = re.compile(r"[-._](F32|F16|BF16|Q\d[A-Z0-9_]*|IQ\d[A-Z0-9_]*|MXFP4[A-Z0-9_]*)$", re.IGNORECASE)

REPO_ID_RULES = ("ORG/NAME: ASCII letters, digits, '-', '_', '.', starting and ending with a letter or digit, "
                 "without '--' or '..'")


def is_repo_id(text: object) -> bool:
    if not isinstance(text, str) or text.count("/") != 1:
        return False
    owner, name = text.split("/")
    return (all(_PART.fullmatch(part) and "--" not in part and ".." not in part for part in (owner, name))
            and not name.endswith(".git"))


def is_revision(text: object) -> bool:
    if not isinstance(text, str):
        return False
    if _PULL_REQUEST.fullmatch(text):
        return True
    return bool(_BRANCH.fullmatch(text)) and ".." not in text and not text.endswith((".", ".lock"))


def is_commit(text: object) -> bool:
    return isinstance(text, str) and COMMIT.fullmatch(text) is not None


def check_repo_id(text: object, option: str, error: type[DflashError] = InputError) -> str:
    """`text` when it is a repo id the Hub accepts; `error` naming `option` otherwise."""
    if not is_repo_id(text):
        raise error(f"{option} {shown(repr(text)[:120])}: not a Hub repository id; give {REPO_ID_RULES}")
    return text


def commit_id(value: object, source: object, field: str, error: type[DflashError] = InputError) -> str:
    """`value` when it is a commit id (what a release records as a source revision); `error` otherwise."""
    if not is_commit(value):
        raise error(f"{shown(source)}: {field} {shown(repr(value)[:80])} is not a commit id (40 hex digits); "
                    "a release records the exact commit it read: name the source again")
    return value
