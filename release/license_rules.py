"""License rules for sharing drafter files, read by `release` and `publish`: the effective terms of a
drafter and its target, the card's gating, what may be published (the license parser and the kinds of
terms they use are the base's, dflash_gguf/licenses.py).

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
from pathlib import Path

from dflash_gguf.confined_reader import file_in
from dflash_gguf.errors import LicenseError
from dflash_gguf.gguf.license import license_from_gguf
from dflash_gguf.licenses import LLAMA, STRICTNESS, Kind, License, LlamaTerms, gating_fields, license_from_card, \
    licenses_in_texts, read_text, split_front_matter, strictest



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
