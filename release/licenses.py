"""License rules for sharing drafter files: one small module, read by `release` and `publish`.

A drafter GGUF carries the drafter's weights *and* the target's tokenizer, so the terms that apply
to it are the drafter's and the target's together:

    no-derivatives   cc-by-nd-*, cc-by-nc-nd-*        refused: a converted or quantized copy is
                                                      adapted material, it may not be shared
    missing/unknown  no license, or one not known     refused unless --license / --target-license
                                                      names it
    non-commercial   cc-by-nc-*, research-only terms  allowed, carried to the card and flagged there
    llama            llama2 ... llama4                allowed with the agreement referenced, "Built
                                                      with Llama" on the card and a NOTICE file
    other            license: other                   allowed when license_name and license_link
                                                      say what it is
    permissive       apache-2.0, mit, cc-by-4.0, ...  allowed, carried to the card

Gating fields (`extra_gated_*`) of either model card are carried over to the release's card.
Licenses are read from a model folder's README.md front matter or from a GGUF's `general.license`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import yaml

from ..confine import file_in
from ..errors import LicenseError
from ..inputs import open_regular


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
    try:
        meta = yaml.safe_load("".join(lines[1:end])) or {}
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" (line {where.line + 2})" if where is not None else ""
        raise LicenseError(f"{source}: front matter is not valid YAML{line}") from None
    except RecursionError:
        raise LicenseError(f"{source}: front matter is nested too deeply to be a model card") from None
    if not isinstance(meta, dict):
        raise LicenseError(f"{source}: front matter is not a YAML mapping")
    return meta, "".join(lines[end + 1:])


def read_card(folder: Path) -> dict:
    """The front matter of a model folder's README.md ({} when there is none). A README.md that is
    a link out of the folder is refused (its fields are carried into a release's card)."""
    readme = file_in(folder, "README.md", "model card")
    if readme is None:
        return {}
    return split_front_matter(read_text(readme), str(readme.path))[0]


_CARD_MAX_BYTES = 8 << 20


def read_text(source, limit: int = _CARD_MAX_BYTES) -> str:
    """The text of a card or license file (at most `limit` bytes), from the file the confined reader
    opened (confine.Opened) or, for a file named on the command line, its path."""
    if hasattr(source, "pread"):
        return source.pread(limit, 0).decode("utf-8", errors="replace")
    with open_regular(source, "model card or license file") as fh:
        return fh.read(limit).decode("utf-8", errors="replace")


def gating_fields(meta: dict) -> dict:
    """The card's `extra_gated_*` fields, in their order."""
    return {k: v for k, v in meta.items() if isinstance(k, str) and k.startswith("extra_gated_")}


def strictest(found: list[License]) -> License:
    """The strictest of the licenses found for one work (the first of equals); MISSING when none."""
    return max(found, key=lambda lic: STRICTNESS[lic.kind])


def license_from_card(meta: dict, source: str, folder: Path | None = None, repo: str | None = None) -> License:
    name, link = meta.get("license_name"), meta.get("license_link")
    name = str(name) if name is not None else None
    link = str(link) if link is not None else None
    found = [License(i, source, name, link, folder, repo) for i in license_ids(meta.get("license"))]
    return strictest(found) if found else License(None, source, name, link, folder, repo)


# Texts of the Creative Commons NoDerivatives licenses (deeds, legal code, their URLs).
_ND_TEXT = re.compile(r"Attribution-(?:NonCommercial-)?NoDerivatives|Attribution-(?:NonCommercial-)?NoDerivs|"
                      r"\bCC[ -]BY-(?:NC-)?ND\b|creativecommons\.org/licenses/by-(?:nc-)?nd/", re.IGNORECASE)


def licenses_in_texts(folder: Path) -> list[License]:
    """NoDerivatives terms stated in a folder's license files (LICENSE, ...), whatever its card says."""
    found = []
    for name in LICENSE_FILE_NAMES:
        path = file_in(folder, name, "license file")
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


def license_from_gguf(path, opened=None) -> License:
    """`general.license` (with `general.license.name` / `.link` for `other`) of a GGUF; the strictest
    when it names several. `opened`: the file already open as a GGUFFile, or its metadata as a dict
    (saves parsing it again)."""
    from ..convert.gguf_file import GGUFFile
    from ..convert.keys import General

    f = opened if opened is not None else GGUFFile(path)
    try:
        value, name, link = f.get(General.LICENSE), f.get(General.LICENSE_NAME), f.get(General.LICENSE_LINK)
        repo = f.get(General.REPO_URL)
    finally:
        if opened is None:
            f.close()
    name = str(name) if name is not None else None
    link = str(link) if link is not None else None
    repo = str(repo) if repo is not None else None
    source = f"{path} {General.LICENSE}"
    found = [License(i, source, name, link, None, repo) for i in license_ids(value)]
    return strictest(found) if found else License(None, source, name, link, None, repo)


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


# ---------------------------------------------------------------------------------------------
# The effective terms of a drafter GGUF: the drafter's and the target's
# ---------------------------------------------------------------------------------------------

@dataclass
class Terms:
    drafter: License
    target: License
    card: dict                                  # license / license_name / license_link for the card
    gating: dict = field(default_factory=dict)  # extra_gated_* carried over
    llama: list[LlamaTerms] = field(default_factory=list)
    non_commercial: bool = False

    @property
    def notice(self) -> str | None:
        """The NOTICE text the Llama licenses require, or None."""
        if not self.llama:
            return None
        return "\n".join(t.notice for t in self.llama) + "\n"

    @property
    def built_with(self) -> str | None:
        return self.llama[0].built_with if self.llama else None

    @property
    def combined(self) -> bool:
        """The card names both licenses together (license: other, link to LICENSES.md)."""
        return self.card.get("license_link") == COMBINED_LICENSE_FILE


COMBINED_LICENSE_FILE = "LICENSES.md"


def _refusal(lic: License, role: str, option: str) -> str | None:
    kind = lic.kind
    if kind is Kind.NO_DERIVATIVES:
        return (f"{role} license {lic.label} ({lic.source}) is NoDerivatives: converted or quantized "
                "copies may not be shared")
    if kind is Kind.MISSING:
        return f"{role} declares no license ({lic.source}); pass {option} ID if you know its terms"
    if kind is Kind.UNKNOWN:
        what = "license 'other' without license_name/license_link" if lic.id == "other" else f"license {lic.id!r}"
        return f"{role} {what} is not one this tool can judge ({lic.source}); pass {option} ID"
    return None


def _card_fields(lic: License) -> dict:
    if lic.id != "other":
        return {"license": lic.id}
    return {"license": "other", "license_name": lic.name, "license_link": lic.link}


def _rank(kind: Kind) -> int:
    return {Kind.PERMISSIVE: 0, Kind.OTHER: 1, Kind.NON_COMMERCIAL: 1, Kind.LLAMA: 1}[kind]


def effective_terms(drafter: License, target: License, gating: dict | None = None) -> Terms:
    """The terms of a drafter GGUF built from `drafter` with `target`'s tokenizer.

    Raises LicenseError (naming every reason) when sharing it is not allowed or cannot be judged.
    """
    problems = [p for p in (_refusal(drafter, "drafter", "--license"),
                            _refusal(target, "target", "--target-license")) if p]
    if problems:
        raise LicenseError("; ".join(problems))
    same = drafter.id == target.id and (drafter.id != "other" or drafter.name == target.name)
    if same or _rank(target.kind) == 0:
        card = _card_fields(drafter)          # the drafter's weights are the work; the target adds nothing stricter
    elif _rank(drafter.kind) == 0:
        card = _card_fields(target)           # the target's tokenizer brings the stricter terms
    else:                                     # two different restrictive licenses: both apply
        name = f"{drafter.label}-and-{target.label}"
        card = {"license": "other", "license_name": re.sub(r"[^a-z0-9.+-]+", "-", name.lower()),
                "license_link": COMBINED_LICENSE_FILE}
    llama = [LLAMA[lic.id] for lic in (drafter, target) if lic.kind is Kind.LLAMA]
    llama = list(dict.fromkeys(llama))
    nc = Kind.NON_COMMERCIAL in (drafter.kind, target.kind)
    return Terms(drafter, target, card, dict(gating or {}), llama, nc)


def merge_gating(*metas: dict) -> dict:
    """`extra_gated_*` fields of several cards: the first card's value wins, dict fields are merged."""
    out: dict = {}
    for meta in metas:
        for key, value in gating_fields(meta).items():
            if key not in out:
                out[key] = value
            elif isinstance(out[key], dict) and isinstance(value, dict):
                out[key] = {**value, **out[key]}
    return out


def describe_license(license_: License) -> str:
    """A license as the card and LICENSES.md state it: the id, a Llama agreement's title and link,
    or an `other` license's name and link."""
    if license_.id == "other":
        link = license_.link or ""
        if link and "://" not in link and license_.repo:
            link = f"https://huggingface.co/{license_.repo}/blob/main/{link}"
        return f"{license_.name} ({link})" if link else str(license_.name)
    if license_.id in LLAMA:
        terms = LLAMA[license_.id]
        return f"{license_.id}: {terms.title} ({terms.agreement})"
    return f"{license_.id}"


# ---------------------------------------------------------------------------------------------
# What a release folder must hold before it is published
# ---------------------------------------------------------------------------------------------

def publish_problems(folder: Path, ggufs: list[Path] = ()) -> list[str]:
    """Why the release folder may not be published (empty when it may). The strictest terms found
    anywhere win: the card, the license files' texts, and each GGUF's general.license."""
    folder = Path(folder)
    readme = file_in(folder, "README.md", "model card")
    if readme is None:
        return [f"{folder / 'README.md'}: missing; a release needs its model card (license, base_model) in the same commit"]
    meta, _ = split_front_matter(read_text(readme), str(readme.path))
    card = license_from_card(meta, str(readme.path), folder)
    found = [card, *licenses_in_texts(folder), *(license_from_gguf(g) for g in ggufs)]
    lic = strictest(found)
    problems = []
    if lic.kind is Kind.NO_DERIVATIVES:
        problems.append(f"{lic.source}: license {lic.label} is NoDerivatives: this folder may not be published")
    elif lic.kind in (Kind.MISSING, Kind.UNKNOWN):
        problems.append(f"{lic.source}: license {lic.label!r} cannot be published as it is (give a Hub license id, "
                        "or other + license_name + license_link, in the front matter)")
    elif lic is not card and STRICTNESS[lic.kind] > STRICTNESS[card.kind]:
        problems.append(f"{lic.source}: license {lic.label} is stricter than the card's {card.label} ({readme.path}); "
                        "the card must state the terms that apply")
    if card.id == "other" and card.link and "://" not in card.link \
            and file_in(folder, card.link.removeprefix("./"), "license_link file") is None:
        problems.append(f"{readme.path}: license_link {card.link!r} names a file this folder lacks")
    mentions_llama = any(x.kind is Kind.LLAMA or (x.id == "other" and "llama" in (x.name or "")) for x in found)
    if mentions_llama and file_in(folder, "NOTICE") is None:
        problems.append(f"{folder}: the Llama license requires a NOTICE file beside the model card")
    return problems
