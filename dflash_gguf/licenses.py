"""Reading and judging licenses: one parser for every spelling a card, a license file, an option or
a GGUF uses, and the kind of terms each id is (the rules `convert`, `quantize`, `release` and
`publish` share; release/license_rules.py adds what a release's terms are made of).

    no-derivatives   cc-by-nd-*, cc-by-nc-nd-*        a converted or quantized copy may not be shared
    missing/unknown  no license, or one not known     refused unless --license / --target-license
                                                      names it
    non-commercial   cc-by-nc-*, research-only terms  allowed, carried to the card and flagged there
    llama            llama2 ... llama4                allowed with the agreement referenced
    other            license: other                   allowed when license_name and license_link
                                                      say what it is
    permissive       apache-2.0, mit, cc-by-4.0, ...  allowed, carried to the card

Licenses are read from a model folder's README.md front matter (YAML parsed with limits: no aliases,
bounded size and depth) and license files, through the confined reader, or from a GGUF's
`general.license` (dflash_gguf/gguf/license.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import yaml

from . import typed_reader as values
from .confined_reader import Opened, file_in
from .errors import LicenseError
from .inputs import TEXT_LIMIT, decode_text, open_regular
from .secrets import refuse_secrets


class Kind(str, Enum):
    PERMISSIVE = "permissive"
    NON_COMMERCIAL = "non-commercial"
    NO_DERIVATIVES = "no-derivatives"
    LLAMA = "llama"
    OTHER = "other"
    UNKNOWN = "unknown"
    MISSING = "missing"


# Hub license ids whose terms allow sharing converted and quantized copies when the license travels
# with them (use restrictions of the RAIL family and gemma included: they travel with the card).
REDISTRIBUTABLE = frozenset({
    "apache-2.0", "mit", "afl-3.0", "artistic-2.0", "bsl-1.0", "bsd", "bsd-2-clause", "bsd-3-clause",
    "bsd-3-clause-clear", "c-uda", "cc0-1.0", "cc-by-2.0", "cc-by-2.5", "cc-by-3.0", "cc-by-4.0",
    "cc-by-sa-3.0", "cc-by-sa-4.0", "cdla-sharing-1.0", "cdla-permissive-1.0", "cdla-permissive-2.0",
    "wtfpl", "ecl-2.0", "epl-1.0", "epl-2.0", "etalab-2.0", "eupl-1.1", "eupl-1.2", "agpl-3.0", "gfdl",
    "gpl", "gpl-2.0", "gpl-3.0", "lgpl", "lgpl-2.1", "lgpl-3.0", "lgpl-lr", "isc", "lppl-1.3c", "ms-pl",
    "apple-ascl", "mpl-2.0", "odc-by", "odbl", "openmdw-1.0", "osl-3.0", "postgresql", "ofl-1.1",
    "ncsa", "unlicense", "zlib", "pddl", "openrail", "openrail++", "bigscience-openrail-m",
    "creativeml-openrail-m", "bigscience-bloom-rail-1.0", "bigcode-openrail-m", "gemma",
})
# Terms that allow non-commercial (or research-only) sharing with the license carried.
NON_COMMERCIAL = frozenset({
    "cc-by-nc-2.0", "cc-by-nc-3.0", "cc-by-nc-4.0", "cc-by-nc-sa-2.0", "cc-by-nc-sa-3.0",
    "cc-by-nc-sa-4.0", "fair-noncommercial-research-license", "apple-amlr", "deepfloyd-if-license",
    "h-research", "intel-research",
})
_NO_DERIVATIVES = re.compile(r"^cc-by(-nc)?-nd(-\d+(\.\d+)?)?$")

# The Llama community licenses: where the agreement is, what NOTICE must say, what the card shows.
@dataclass(frozen=True)
class LlamaTerms:
    title: str
    agreement: str
    notice: str
    built_with: str


LLAMA = {
    "llama2": LlamaTerms(
        "Llama 2 Community License", "https://ai.meta.com/llama/license/",
        "Llama 2 is licensed under the LLAMA 2 Community License, Copyright (c) Meta Platforms, Inc. "
        "All Rights Reserved.", "Built with Llama"),
    "llama3": LlamaTerms(
        "Meta Llama 3 Community License", "https://www.llama.com/llama3/license/",
        "Meta Llama 3 is licensed under the Meta Llama 3 Community License, Copyright © Meta Platforms, "
        "Inc. All Rights Reserved.", "Built with Meta Llama 3"),
    "llama3.1": LlamaTerms(
        "Llama 3.1 Community License", "https://www.llama.com/llama3_1/license/",
        "Llama 3.1 is licensed under the Llama 3.1 Community License, Copyright © Meta Platforms, Inc. "
        "All Rights Reserved.", "Built with Llama"),
    "llama3.2": LlamaTerms(
        "Llama 3.2 Community License", "https://www.llama.com/llama3_2/license/",
        "Llama 3.2 is licensed under the Llama 3.2 Community License, Copyright © Meta Platforms, Inc. "
        "All Rights Reserved.", "Built with Llama"),
    "llama3.3": LlamaTerms(
        "Llama 3.3 Community License", "https://www.llama.com/llama3_3/license/",
        "Llama 3.3 is licensed under the Llama 3.3 Community License, Copyright © Meta Platforms, Inc. "
        "All Rights Reserved.", "Built with Llama"),
    "llama4": LlamaTerms(
        "Llama 4 Community License", "https://www.llama.com/llama4/license/",
        "Llama 4 is licensed under the Llama 4 Community License, Copyright © Meta Platforms, Inc. "
        "All Rights Reserved.", "Built with Llama"),
}

# Spellings seen in GGUF `general.license` values and hand-written cards, mapped to Hub ids.
_ALIASES = {
    "apache-2": "apache-2.0", "apache2": "apache-2.0", "apache-license-2.0": "apache-2.0",
    "apache-license-version-2.0": "apache-2.0", "apache-2.0-license": "apache-2.0",
    "mit-license": "mit", "the-mit-license": "mit",
    "llama-2": "llama2", "llama-3": "llama3", "llama-3.1": "llama3.1", "llama-3.2": "llama3.2",
    "llama-3.3": "llama3.3", "llama-4": "llama4",
}

# Files of a model folder that belong with its license (copied into a release).
LICENSE_FILE_NAMES = ("LICENSE", "LICENSE.txt", "LICENSE.md", "LICENCE", "LICENCE.txt", "NOTICE",
                      "NOTICE.txt", "NOTICE.md", "USE_POLICY.md", "USE_POLICY.txt")


def normalize_id(value: object) -> str | None:
    """A license value as a lower-case Hub id ("Apache-2.0" -> "apache-2.0"); None when empty.
    A list or a multi-license string gives its strictest id (see `license_ids`)."""
    ids = license_ids(value)
    return strictest_id(ids) if ids else None


def _normalize_one(text: str) -> str | None:
    text = re.sub(r"[\s_,]+", "-", text.strip().lower()).strip("-")
    return _ALIASES.get(text, text) if text else None


_COMMENT = re.compile(r"(^|\s)#.*$")
_SEPARATORS = re.compile(r"\s*(?:[,;/+&|]|\band\b|\bor\b|\bAND\b|\bOR\b)\s*")


def license_ids(value: object) -> list[str]:
    """Every license a metadata value names, as normalized Hub ids: the one parser for card
    `license:` fields (a YAML string or list), GGUF `general.license` strings (which may carry a
    trailing `# comment`, or name several licenses: "mit AND cc-by-nc-nd-4.0") and option values."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [i for item in value for i in license_ids(item)]
    if isinstance(value, dict):
        return [i for item in value.values() for i in license_ids(item)]
    text = _COMMENT.sub("", str(value)).strip()
    whole = _normalize_one(text)
    if whole is None:
        return []
    if kind_of(whole) is not Kind.UNKNOWN:
        return [whole]
    parts = [p for p in (_normalize_one(part) for part in _SEPARATORS.split(text)) if p]
    return parts if len(parts) > 1 else [whole]


# How strict each family is: where several terms are found for one work, the strictest applies.
STRICTNESS = {Kind.MISSING: 0, Kind.PERMISSIVE: 1, Kind.OTHER: 2, Kind.LLAMA: 3, Kind.NON_COMMERCIAL: 3,
              Kind.UNKNOWN: 4, Kind.NO_DERIVATIVES: 5}


def strictest_id(ids: list[str]) -> str:
    return max(ids, key=lambda i: STRICTNESS[kind_of(i)])


def kind_of(license_id: str | None) -> Kind:
    """The family of a normalized Hub license id."""
    if license_id is None:
        return Kind.MISSING
    if _NO_DERIVATIVES.match(license_id):
        return Kind.NO_DERIVATIVES
    if license_id in LLAMA:
        return Kind.LLAMA
    if license_id in NON_COMMERCIAL:
        return Kind.NON_COMMERCIAL
    if license_id in REDISTRIBUTABLE:
        return Kind.PERMISSIVE
    if license_id == "other":
        return Kind.OTHER
    return Kind.UNKNOWN


@dataclass(frozen=True)
class License:
    """One model's declared license."""

    id: str | None                 # normalized Hub id; None when nothing is declared
    source: str                    # where it was read: "z/README.md", "t.gguf general.license", "--license"
    name: str | None = None        # license_name (for `other`)
    link: str | None = None        # license_link (for `other`): a URL or a file of the model's folder
    folder: Path | None = None     # the model folder, for a relative license_link and license files
    repo: str | None = None        # the model's Hub repo id, when known (absolute links)

    @property
    def kind(self) -> Kind:
        if self.id == "other":
            # `other` names its terms; those may be a family we know (license_name: cc-by-nc-nd-4.0)
            named = [kind_of(i) for i in license_ids(self.name)]
            if Kind.NO_DERIVATIVES in named:
                return Kind.NO_DERIVATIVES
            return Kind.OTHER if self.name and self.link else Kind.UNKNOWN
        return kind_of(self.id)

    @property
    def label(self) -> str:
        if self.id == "other":
            return self.name or "other"
        return self.id or "no license"


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------

FRONT_MATTER_LIMIT = 256 << 10  # characters: far above a real card's front matter (model-index included)
_YAML_DEPTH = 64
_YAML_EVENTS = 200_000
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _bounded_yaml(text: str, source: str):
    """YAML parsed with limits before anything is built: no aliases (a billion laughs), bounded depth
    and size; then loaded as plain data by the safe loader."""
    depth = events = 0
    for event in yaml.parse(text, Loader=_SafeLoader):
        events += 1
        if isinstance(event, yaml.AliasEvent):
            raise LicenseError(f"{source}: front matter uses a YAML alias (*{event.anchor}); a model card's front "
                               "matter is plain data: write the value out")
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > _YAML_DEPTH:
                raise LicenseError(f"{source}: front matter is nested too deeply to be a model card")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        if events > _YAML_EVENTS:
            raise LicenseError(f"{source}: front matter has more than {_YAML_EVENTS} YAML nodes; not a model card")
    return yaml.load(text, Loader=_SafeLoader)  # noqa: S506 - the safe loader, C or Python


def split_front_matter(text: str, source: str = "README.md") -> tuple[dict, str]:
    """(YAML front matter as a dict, the rest of the text). No front matter gives ({}, text)."""
    text = text.lstrip("\ufeff")
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        return {}, text
    for end in range(1, len(lines)):
        if lines[end].strip() == "---":
            break
    else:
        raise LicenseError(f"{source}: front matter opened with '---' is never closed")
    front = "".join(lines[1:end])
    if len(front) > FRONT_MATTER_LIMIT:
        raise LicenseError(f"{source}: front matter is {len(front)} characters, over the {FRONT_MATTER_LIMIT >> 10} KiB "
                           "a model card's may be")
    try:
        meta = _bounded_yaml(front, source) or {}
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" (line {where.line + 2})" if where is not None else ""
        raise LicenseError(f"{source}: front matter is not valid YAML{line}") from None
    except RecursionError:
        raise LicenseError(f"{source}: front matter is nested too deeply to be a model card") from None
    except (ValueError, TypeError, OverflowError) as err:  # an integer of 5,000 digits, a date out of range
        raise LicenseError(f"{source}: front matter holds a value YAML cannot build ({str(err)[:60]}); fix the "
                           "model card") from None
    if not isinstance(meta, dict):
        raise LicenseError(f"{source}: front matter is not a YAML mapping")
    return meta, "".join(lines[end + 1:])


def read_card(folder: Path) -> dict:
    """The front matter of a model folder's README.md ({} when there is none), its `extra_gated_*`
    fields typed. A README.md that is a link out of the folder is refused (its fields are carried
    into a release's card)."""
    readme = file_in(folder, "README.md", "model card")
    if readme is None:
        return {}
    meta = split_front_matter(read_text(readme), str(readme.path))[0]
    for key, value in gating_fields(meta).items():
        _gating_value(str(readme.path), key, value)
    return meta


def _gating_value(source: str, name: str, value: object) -> None:
    """A gating field is plain card data: text (line breaks allowed, no other control character), a
    boolean or an integer, or lists and mappings of them; never a date, bytes or a set YAML built."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            _gating_value(source, f"{name}[{i}]", item)
    elif isinstance(value, dict):
        for key, item in value.items():
            values.string(source, f"{name} key", key, 256, error=LicenseError)
            _gating_value(source, f"{name}.{key}", item)
    elif not isinstance(value, (bool, int)):
        values.string(source, name, value, lines=True, error=LicenseError)


_CARD_MAX_BYTES = 8 << 20


def read_text(source, limit: int = _CARD_MAX_BYTES) -> str:
    """The text of a card or license file (at most `limit` bytes), from the file the confined reader
    opened (confine.Opened) or, for a file named on the command line, its path."""
    what = "model card or license file"
    if hasattr(source, "pread"):
        data, path = source.pread(limit + 1, 0), source.path
    else:
        with open_regular(source, what) as fh:
            data, path = fh.read(limit + 1), source
    return decode_text(data[:limit], path, what, truncated=len(data) > limit)


def gating_fields(meta: dict) -> dict:
    """The card's `extra_gated_*` fields, in their order."""
    return {k: v for k, v in meta.items() if isinstance(k, str) and k.startswith("extra_gated_")}


def strictest(found: list[License]) -> License:
    """The strictest of the licenses found for one work (the first of equals); MISSING when none."""
    return max(found, key=lambda lic: STRICTNESS[lic.kind])


def _card_licenses(meta: dict, source: str) -> list[str]:
    """The card's `license:` typed: a string, or a list of strings, each short text without control
    characters (never a date, bytes or a set YAML built)."""
    value = meta.get("license")
    items = value if isinstance(value, list) and len(value) <= 16 else [] if value is None else [value]
    return [values.string(source, "license", item.strip() if isinstance(item, str) else item, 256, error=LicenseError)
            for item in items]


def license_from_card(meta: dict, source: str, folder: Path | None = None, repo: str | None = None) -> License:
    name, link = meta.get("license_name"), meta.get("license_link")
    # typed: text without control characters (a YAML block scalar's final newline is whitespace, stripped)
    name = values.string(source, "license_name", str(name).strip(), 256, error=LicenseError) if name is not None else None
    link = values.string(source, "license_link", str(link).strip(), 2048, error=LicenseError) if link is not None else None
    licenses = _card_licenses(meta, source)
    # before the ids are normalised: what the card holds, not a lowercased copy of it
    for field, texts in (("license", licenses), ("license_name", [name]), ("license_link", [link])):
        refuse_secrets(texts, f"{source}: field {field!r}")
    found = [License(i, source, name, link, folder, repo) for i in license_ids(licenses)]
    return strictest(found) if found else License(None, source, name, link, folder, repo)


# Texts of the Creative Commons NoDerivatives licenses (deeds, legal code, their URLs).
_ND_TEXT = re.compile(r"Attribution-(?:NonCommercial-)?NoDerivatives|Attribution-(?:NonCommercial-)?NoDerivs|"
                      r"\bCC[ -]BY-(?:NC-)?ND\b|creativecommons\.org/licenses/by-(?:nc-)?nd/", re.IGNORECASE)


def license_file(folder: Path, name: str, what: str = "license file") -> Opened | None:
    """A license or notice file of a model or release folder, opened by the confined reader and
    refused when larger than a text file may be (it is copied into a release and uploaded whole)."""
    opened = file_in(folder, name, what)
    return opened.within(TEXT_LIMIT, what) if opened is not None else None


def licenses_in_texts(folder: Path) -> list[License]:
    """NoDerivatives terms stated in a folder's license files (LICENSE, ...), whatever its card says."""
    found = []
    for name in LICENSE_FILE_NAMES:
        path = license_file(folder, name)
        if path is None:
            continue
        match = _ND_TEXT.search(read_text(path, 1 << 20))
        if match:
            nc = "noncommercial" in match.group(0).lower() or "-nc-" in match.group(0).lower()
            found.append(License("cc-by-nc-nd" if nc else "cc-by-nd", f"{path.path} (its text)", folder=Path(folder)))
    return found


def license_from_folder(folder: Path, repo: str | None = None) -> License:
    """A model folder's license: its card's, unless its license files state stricter terms."""
    folder = Path(folder)
    card = license_from_card(read_card(folder), str(folder / "README.md"), folder, repo)
    return strictest([card, *licenses_in_texts(folder)])


def with_override(declared: License, override: str | None, option: str) -> License:
    """Apply `--license` / `--target-license`.

    The option fills in a license that is missing or unknown. It may not contradict a license the
    model card already declares: a card that says cc-by-nc-nd-4.0 is not made shareable by a flag.
    """
    if override is None:
        return declared
    wanted = normalize_id(override)
    if wanted is None:
        raise LicenseError(f"{option}: empty license id")
    if kind_of(wanted) is Kind.UNKNOWN:
        raise LicenseError(
            f"{option} {override!r}: not a Hub license id this tool knows; use a Hub id (apache-2.0, "
            "mit, cc-by-nc-4.0, llama3.1, ...) or 'other' with license_name/license_link in the model card")
    if declared.kind not in (Kind.MISSING, Kind.UNKNOWN) and wanted != declared.id:
        raise LicenseError(
            f"{option} {wanted}: {declared.source} declares {declared.label}; the card's license stands "
            "(correct the model card if the license really changed)")
    if wanted == "other" and not (declared.name and declared.link):
        raise LicenseError(
            f"{option} other: {declared.source} has no license_name and license_link to say which terms; "
            "add them to its front matter")
    return License(wanted, option, declared.name, declared.link, declared.folder, declared.repo)
