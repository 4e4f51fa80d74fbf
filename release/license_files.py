"""The license files a release holds: copies from the model folders, NOTICE, LICENSES.md, and the
license fields its card states."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dflash_gguf.confined_reader import Opened
from dflash_gguf.errors import LicenseError
from dflash_gguf.licenses import LICENSE_FILE_NAMES, license_file, read_text
from . import license_rules as lic


@dataclass
class LicensePlan:
    card: dict                                             # license fields for the front matter
    copies: dict[str, Opened] = field(default_factory=dict)  # release file name -> source file, as opened
    notice: str | None = None                              # NOTICE text to write, when needed
    combined: str | None = None                            # LICENSES.md text, when needed


def _license_files(folder: Path | None) -> list[Opened]:
    if folder is None or not Path(folder).is_dir():
        return []
    found = (license_file(folder, n) for n in LICENSE_FILE_NAMES)
    return [path for path in found if path is not None]


def target_name(name: str) -> str:
    """The release name of a target's license file whose name the drafter's already takes."""
    stem, dot, ext = name.partition(".")
    return f"{stem}-target{dot}{ext}"


def plan_license_files(terms: lic.Terms) -> LicensePlan:
    """Which license files the release holds and what the card's license fields say. Raises
    LicenseError (before anything is written) when a `license_link` cannot be honoured."""
    plan = LicensePlan(dict(terms.card))
    renamed: dict[tuple[str, str], str] = {}
    for role, source in (("drafter", terms.drafter), ("target", terms.target)):
        for path in _license_files(source.folder):
            name = path.name if path.name not in plan.copies else target_name(path.name)
            plan.copies[name] = path
            renamed[role, path.name] = name
    link = plan.card.get("license_link")
    if link and link != lic.COMBINED_LICENSE_FILE and "://" not in link:
        owner = next(s for s in (terms.drafter, terms.target) if s.link == link)
        role = "drafter" if owner is terms.drafter else "target"
        if Path(link).is_absolute() or ".." in Path(link).parts:
            raise LicenseError(f"{owner.source}: license_link {link!r} points outside the model folder")
        src = license_file(owner.folder, link.removeprefix("./"), "license_link file") if owner.folder else None
        if src is not None:
            base = Path(link).name  # a release is flat: the file goes to the root
            name = renamed.get((role, link)) or (base if base not in plan.copies else target_name(base))
            plan.copies.setdefault(name, src)
            plan.card["license_link"] = name
        elif owner.repo:
            plan.card["license_link"] = f"https://huggingface.co/{owner.repo}/blob/main/{link}"
        else:
            raise LicenseError(f"{owner.source}: license_link {link!r} is neither a URL nor a file of the "
                                   "model folder; give its URL in the model card")
    if terms.notice:
        parts = [read_text(p).rstrip("\n") for n, p in plan.copies.items() if n == "NOTICE"]
        extra = [line for line in terms.notice.splitlines() if not any(line in p for p in parts)]
        plan.notice = "\n\n".join(parts + ["\n".join(extra)] if extra else parts) + "\n"
        plan.copies.pop("NOTICE", None)
    if terms.combined:
        plan.combined = _combined_text(terms)
    return plan


def _combined_text(terms: lic.Terms) -> str:
    return (
        "# Licenses\n\n"
        "These files combine two works, and the terms of both apply to every file:\n\n"
        f"- the drafter's weights, licensed {lic.describe_license(terms.drafter)};\n"
        f"- the target's tokenizer, embedded in each GGUF, licensed {lic.describe_license(terms.target)}.\n"
    )


def write_license_files(plan: LicensePlan, folder: Path) -> None:
    for rel, src in plan.copies.items():
        src.copy_to(folder / rel)  # the bytes of the file as it was opened and checked
    if plan.notice:
        (folder / "NOTICE").write_text(plan.notice, encoding="utf-8")
    if plan.combined:
        (folder / lic.COMBINED_LICENSE_FILE).write_text(plan.combined, encoding="utf-8")

