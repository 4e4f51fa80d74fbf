"""A release folder: every variant of one drafter, its model card and its license files.

    DIR/dflash-<Target>-<QUANT>.gguf   one file per type, at the root, never split (what ggml-org ships and llama.cpp's `-hf` sidecar discovery finds)
    DIR/README.md                      model card: license, base_model, tags, gating fields, a table
                                       of the variants (size, sha256, acceptance, speedup), how to run
    DIR/NOTICE                         when a Llama license applies
    DIR/LICENSE...                     license files of the drafter (and target) folders, when present
    DIR/LICENSES.md                    when two different restrictive licenses both apply

Nothing is written before the license rules allow the release. The folder is built in a temporary
folder beside DIR and renamed onto DIR at the end, so DIR is either absent, as it was, or whole; an
existing DIR is replaced only with --force and only where every file in it is one an earlier release
wrote, as its manifest records (dflash_gguf/owned_folder.py).

`release()` runs the steps in order: check the request, read the sources (local or from the Hub),
settle the names and the license terms, make and validate each variant, write the license files
and the card, move the folder into place.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from dflash_gguf.convert.converter import convert
from dflash_gguf.errors import ReleaseError
from dflash_gguf.gguf import layout
from dflash_gguf.gguf.describe import DrafterDescription, describe
from dflash_gguf.gguf.llama_support import support_of
from dflash_gguf.gguf.target import TargetInfo
from dflash_gguf.hub import resolve as hub
from dflash_gguf.hub.names import check_repo_id
from dflash_gguf.hub.resolve import HubRef
from dflash_gguf.outputs import Input, Output, check_outputs
from dflash_gguf.owned_folder import built_beside, check_destination
from dflash_gguf.progress import Progress, working
from dflash_gguf.secrets import refuse_secrets
from dflash_gguf.settings import Settings, option, refusal
from dflash_gguf.quantize.quantize import (DEFAULT_RECIPE, FLOAT_TYPES, Recipe, find_llama_quantize, get_recipe, parse_type,
                                 quantize)
from dflash_gguf.hashing import sha256_file
from dflash_gguf.licenses import License, license_from_folder, read_card, with_override
from dflash_gguf.runner.launch import parse_server_args, speculative_args
from dflash_gguf.runner.prompts import BUILTIN_PROMPTS
from dflash_gguf.validation import validate as validator
from dflash_gguf.validation.validate import ValidationSettings
from . import license_rules as lic
from .card import NOT_VALIDATED, ReleaseResult, VariantResult, example_variant, render_card
from .license_files import LicensePlan, plan_license_files, write_license_files
from .file_names import drafter_repo, resolve_target, safe_name, target_facts, variant_file


def parse_types(types: str | list[str]) -> list[str]:
    items = types.split(",") if isinstance(types, str) else list(types)
    out = list(dict.fromkeys(parse_type(t, "--types") for t in items if t.strip()))
    if not out:
        raise ReleaseError("--types: give at least one type, e.g. F16,Q8_0,Q4_K_M")
    return out


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------

def _not_validated(why: str) -> dict:
    return {"validated": False, "tau": None, "speedup": None, "note": f"{NOT_VALIDATED} ({why})"}


def validate_variant(target: Path | TargetInfo, draft_path: Path, settings=None, progress=None) -> dict:
    """Run `validate` (validation/validate.py) on one variant beside its target, on the built-in prompts
    with `settings` (its build and llama-server arguments are the release's).

    Returns {"validated": bool, "tau": float | None, "speedup": float | None, "note": str}: tau is
    the report's `mean_acceptance_length` (tokens produced per target verification step), speedup
    tokens/s with the drafter over the target alone. A report whose verdict is not 0 (the
    speculative output differs from the target's own) raises ReleaseError, which stops the release
    and leaves nothing behind. For a target given as a folder (llama-server needs the target's
    GGUF) the card says "not validated".
    """

    if isinstance(target, TargetInfo):
        if target.local_gguf is None:
            return _not_validated("the target GGUF was read on the Hub without downloading it; validation runs "
                                  "a local copy")
        target = target.local_gguf
    if not Path(target).is_file():
        return _not_validated("the target was given as a folder; validation runs its GGUF")
    target, draft_path = Path(target), Path(draft_path)
    result = validator.validate(target, draft_path, list(BUILTIN_PROMPTS), settings or validator.ValidationSettings(),
                                progress=progress)
    if validator.verdict(result, False) != 0:
        bad = sum(1 for d in result.divergences if d.get("kind") == "mismatch")
        raise ReleaseError(f"{draft_path.name}: validation failed: with the drafter, {bad} token(s) were not "
                           f"{target.name}'s own; run `dflash-gguf validate` for the report")
    speedup = result.speedup
    return {"validated": True, "tau": float(result.mean_acceptance_length),
            "speedup": float(speedup) if speedup is not None else None,
            "speedup_unreliable": result.speed.get("speedup_unreliable"), "note": "validated"}


# ---------------------------------------------------------------------------------------------
# The steps
# ---------------------------------------------------------------------------------------------

@dataclass
class _Making:
    """How the variants are made: from which checkpoint, for which target, on which build."""
    draft_dir: Path
    target: Path | TargetInfo
    recipe: Recipe
    backend: str | None
    llama_bin: Path | None
    threads: int | None
    validation: ValidationSettings | None  # None with --skip-validate


@dataclass
class _Settled:
    """What the release is called and the terms it is shared under, settled before anything is written."""
    name: str
    base_model: str
    target_repo: str | None
    terms: lic.Terms
    license_files: LicensePlan
    warnings: list[str]

    @property
    def gguf_license(self) -> License:
        """The license each variant's general.license states: the card's."""
        card = self.license_files.card
        return License(card["license"], "the release's card", card.get("license_name"), card.get("license_link"))


@dataclass(frozen=True, kw_only=True)
class ReleaseSettings(Settings):
    """`dflash-gguf release`'s options, checked together as they are built (dflash_gguf/settings.py).
    `release()` takes them; `--push` (push.py) and `--into` (sidecar.py) pass them on, settling the
    target, the folder and the name."""

    draft_dir: str | Path | HubRef
    target: str | Path | HubRef | TargetInfo | None = None
    types: str | Sequence[str]
    out_dir: str | Path | None = None
    push_repo: str | None = option("--push")
    into_repo: str | None = option("--into")
    license_id: str | None = option("--license")
    target_license_id: str | None = None
    name: str | None = None
    base_model: str | None = None
    recipe: str = DEFAULT_RECIPE
    skip_validate: bool = False
    backend: str | None = None
    llama_bin: Path | None = None
    quantize_threads: int | None = None
    force: bool = False
    exact: bool = False                    # validate as `validate --exact` does
    as_json: bool = option("--json", False)
    server_args: Sequence[str] = ()        # to llama-server in each validation, as after `validate --`

    def problems(self) -> Iterator[str]:
        if self.into_repo is not None and self.push_repo is not None:
            yield ("--into and --push: give one (--into adds to the target's GGUF repository, --push makes a "
                   "repository of the release)")
        if self.target is None and self.into_repo is None:
            yield ("--target/-t: give the target model (its GGUF, its folder or a Hub repo id); only --into finds "
                   "it by itself")
        if self.out_dir is None and self.push_repo is None and self.into_repo is None:
            yield "-o/--out: give the release folder to write (or --push ORG/NAME to upload it)"
        yield from refusal(parse_types, self.types)
        yield from refusal(get_recipe, self.recipe)
        if self.server_args and self.skip_validate:
            yield ("llama-server arguments after -- are for validating the variants; --skip-validate runs no "
                   "server")
        yield from refusal(parse_server_args, self.server_args)  # what the runner manages, before any work

    def validation(self) -> ValidationSettings | None:
        """How each variant is validated: on the release's build, with its llama-server arguments."""
        if self.skip_validate:
            return None
        return ValidationSettings(backend=self.backend, llama_bin=self.llama_bin, server_args=list(self.server_args),
                                  exact=self.exact)


def _check_outputs(settings: ReleaseSettings, out_dir: Path) -> None:
    """Refuse a folder the release may not be written to, before any work."""
    check_outputs([Output(out_dir, "-o", folder=True)],
                  [Input(settings.draft_dir, "DRAFT_DIR"), Input(settings.target, "--target"),
                   Input(settings.llama_bin, "--llama-bin")])
    check_destination(out_dir, settings.force, "release")


def _read_sources(draft_dir: str | Path, target: str | Path) -> tuple[Path, Path | TargetInfo]:
    """The drafter folder and the target, local or fetched from the Hub (only what is read)."""
    draft_dir = hub.drafter_folder(draft_dir)
    if not (draft_dir / "config.json").is_file():
        raise ReleaseError(f"{draft_dir}: not a drafter checkpoint folder (no config.json)")
    return draft_dir, resolve_target(target)


def _settle_names_and_terms(draft_dir: Path, target: Path | TargetInfo, name: str | None, base_model: str | None,
                            license_id: str | None, target_license_id: str | None) -> _Settled:
    """The file names, the card's base_model and the license rules, before anything is written."""
    warnings: list[str] = []
    short, target_repo, declared_target = target_facts(target)
    name = safe_name(name) if name else safe_name(short)
    if base_model is not None:
        check_repo_id(base_model, "--base-model", ReleaseError)
    base_model = base_model or drafter_repo(draft_dir)
    if not base_model:
        base_model = hub.folder_name(draft_dir)
        warnings.append(f"base_model {base_model!r} is not a Hub repo id; pass --base-model ORG/NAME "
                        "so the card links the drafter it was made from")
    drafter_card = read_card(draft_dir)
    target_card = read_card(target) if isinstance(target, Path) and target.is_dir() else {}
    declared_drafter = license_from_folder(draft_dir, base_model if "/" in base_model else None)
    drafter_license = with_override(declared_drafter, license_id, "--license")
    target_license = with_override(declared_target, target_license_id, "--target-license")
    terms = lic.effective_terms(drafter_license, target_license, lic.merge_gating(drafter_card, target_card))
    return _Settled(name, base_model, target_repo, terms, plan_license_files(terms), warnings)


def _make_variant(making: _Making, settled: _Settled, qtype: str, base: Path, base_type: str,
                  base_counts: dict[str, int], folder: Path, say: Progress, variant: str) -> VariantResult:
    """One variant in `folder`: the converter's output copied, converted as another float type, or
    quantized with the recipe; then validated beside the target."""
    path = folder / variant_file(settled.name, qtype, variant)
    off: list[str] = []
    used_recipe = None
    if qtype == base_type:
        shutil.copyfile(base, path)
        counts = base_counts
    elif qtype in FLOAT_TYPES:
        say(f"converting {hub.folder_name(making.draft_dir)} as {qtype}")
        convert(making.draft_dir, making.target, path, qtype.lower(), settled.gguf_license)
        counts = describe(path).count_by_type()
    else:
        say(f"quantizing {qtype} (recipe {making.recipe.name})")
        q = quantize(base, path, qtype, making.recipe.name, making.llama_bin, making.threads, backend=making.backend)
        counts, off, used_recipe = q.types, q.off_type, making.recipe.name
    if making.validation is None:
        validation = _not_validated("--skip-validate")
    else:
        say(f"validating {path.name}: every token proven against the target, then the speed in interleaved rounds")
        validation = validate_variant(making.target, path, making.validation,
                                      progress=lambda msg: say(f"  {path.name}: {msg}"))
        say(f"validated {path.name}: {validation['note']}")
    return VariantResult(path.name, qtype, used_recipe, path.stat().st_size, sha256_file(path),
                         validation, counts, off)


@dataclass
class _Made:
    variants: list[VariantResult]
    drafter: DrafterDescription
    sources: dict          # drafter / target: repo, revision, files and sha256 (the converter's provenance)
    warnings: list[str]    # the converter's


def _make_variants(making: _Making, settled: _Settled, wanted: list[str], folder: Path, say: Progress) -> _Made:
    """Convert once, then make every wanted variant from that conversion in `folder`."""
    say(f"converting {hub.folder_name(making.draft_dir)}")
    base = folder / ".base.gguf"
    planned = convert(making.draft_dir, making.target, base, "auto", settled.gguf_license)
    drafter = describe(base)
    base_counts = drafter.count_by_type()
    sources = planned.provenance(hashes=True)
    variants = [_make_variant(making, settled, qtype, base, planned.outtype.upper(), base_counts, folder, say,
                              planned.variant) for qtype in wanted]
    base.unlink()
    return _Made(variants, drafter, sources, list(planned.warnings))


def release(settings: ReleaseSettings, *, progress: Progress | None = None, sidecar_of: str | None = None,
            sidecar_quant: str | None = None) -> ReleaseResult:
    """Convert, quantize, validate and describe one drafter as a release folder at `settings.out_dir`.
    Its backend / llama_bin choose the llama.cpp build that quantizes and validates. `sidecar_of` /
    `sidecar_quant`: the GGUF repository (and its quant) the variants will sit in, for the card (sidecar.py)."""
    started = time.perf_counter()
    say = progress or (lambda _msg: None)
    shown = str(settings.out_dir)
    out_dir = Path(os.path.abspath(settings.out_dir))
    _check_outputs(settings, out_dir)
    wanted, rec = parse_types(settings.types), get_recipe(settings.recipe)
    draft_dir, target = _read_sources(settings.draft_dir, settings.target)
    settled = _settle_names_and_terms(draft_dir, target, settings.name, settings.base_model, settings.license_id,
                                      settings.target_license_id)
    if any(t not in FLOAT_TYPES for t in wanted):
        find_llama_quantize(settings.llama_bin, settings.backend)  # fail now, not after the conversion

    making = _Making(draft_dir, target, rec, settings.backend, settings.llama_bin, settings.quantize_threads,
                     settings.validation())

    with built_beside(out_dir, force=settings.force, command="release") as folder:
        with working(say, "release"):
            made = _make_variants(making, settled, wanted, folder, say)
        runs_on = support_of(made.drafter)
        if not runs_on.stock:
            made.warnings.append(f"stock llama.cpp cannot load these files: {runs_on.why}; the file "
                                 f"{runs_on.text} (the card says so)")
        write_license_files(settled.license_files, folder)
        result = ReleaseResult(
            folder=shown, name=settled.name, base_model=settled.base_model,
            target=str(target.path if isinstance(target, TargetInfo) else target), target_repo=settled.target_repo,
            variant=made.drafter.variant_name, block_size=made.drafter.block_size,
            draft_length=made.drafter.draft_length, spec_type=str(made.drafter.spec_type),
            license=settled.license_files.card, files=[], variants=made.variants,
            warnings=settled.warnings + made.warnings,
            run_args=speculative_args(made.drafter, shown_path=example_variant(made.variants)), sources=made.sources,
            file_prefix=layout.FILE_PREFIXES[made.drafter.variant], sidecar_of=sidecar_of,
            sidecar_quant=sidecar_quant, runs_on=runs_on.to_dict())
        card = render_card(result, settled.terms, settled.license_files)
        refuse_secrets([card], out_dir / "README.md")
        (folder / "README.md").write_text(card, encoding="utf-8")
        result.files = sorted(p.name for p in folder.iterdir())
    result.seconds = round(time.perf_counter() - started, 3)
    return result
