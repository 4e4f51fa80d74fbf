"""A release folder: every variant of one drafter, its model card and its license files.

    DIR/dflash-<Target>-<QUANT>.gguf   one file per type, at the root, never split (what ggml-org ships and llama.cpp's `-hf` sidecar discovery finds)
    DIR/README.md                      model card: license, base_model, tags, gating fields, a table
                                       of the variants (size, sha256, acceptance, speedup), how to run
    DIR/NOTICE                         when a Llama license applies
    DIR/LICENSE...                     license files of the drafter (and target) folders, when present
    DIR/LICENSES.md                    when two different restrictive licenses both apply

Nothing is written before the license rules allow the release. The folder is built in a temporary
folder beside DIR and renamed onto DIR at the end, so DIR is either absent, as it was, or whole.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from .. import __version__
from ..convert import hub
from ..convert.converter import convert
from ..convert.describe import DrafterDescription, describe
from ..convert.gguf_file import GGUFFile
from ..confine import check_inside, file_in
from ..convert.keys import General
from ..convert.target import TargetInfo, load_target
from ..errors import ReleaseError
from ..inputs import InputError, load_json
from ..outputs import Input, Output, check_outputs, named_for, partial_name
from ..runner.launch import parse_server_args, speculative_args
from ..runner.sdist import sha256_file
from . import licenses as lic
from ..quantize.quantize import DEFAULT_RECIPE, FLOAT_TYPES, RECIPES, find_llama_quantize, get_recipe, parse_type, quantize

log = logging.getLogger(__name__)

Progress = Callable[[str], None]

CARD_TAGS = ["gguf", "llama.cpp", "dflash", "speculative-decoding"]
_QUANT_SUFFIX = re.compile(r"[-._](F32|F16|BF16|Q\d[A-Z0-9_]*|IQ\d[A-Z0-9_]*|MXFP4[A-Z0-9_]*)$", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------------

def safe_name(text: str) -> str:
    """A name fit for a Hub file name: letters, digits, '.', '_' and '-' only."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", text.strip()).strip("-.")
    if not name:
        raise ReleaseError(f"--name {text!r}: nothing left for a file name; give letters, digits, '.', '_', '-'")
    return name


def variant_file(name: str, qtype: str) -> str:
    """`dflash-<Target>-<QUANT>.gguf`, the name llama.cpp's drafter discovery looks for."""
    return f"dflash-{name}-{qtype}.gguf"


def _hub_cache_repo(path: Path) -> str | None:
    source = hub.cache_source(path)
    return source.repo if source else None


def _read_json(path: Path) -> dict:
    try:
        data = load_json(path, "config file")
    except InputError:
        return {}
    return data if isinstance(data, dict) else {}


def target_facts(target: Path | TargetInfo) -> tuple[str, str | None, lic.License]:
    """(a short name for file names, the target's Hub repo id when known, its declared license).
    `target` is a folder, a GGUF file, or a target GGUF already read (from the Hub)."""
    if isinstance(target, Path) and target.is_dir():
        repo = _hub_cache_repo(target)
        name_or_path = str(_read_json(target / "config.json").get("_name_or_path") or "")
        if repo is None and re.fullmatch(r"[\w.-]+/[\w.-]+", name_or_path):
            repo = name_or_path
        declared = lic.license_from_folder(target, repo)
        return (repo.split("/")[-1] if repo else hub.folder_name(target)), repo, declared
    if isinstance(target, TargetInfo):
        path, general, source = target.path, target.general, target.source
    else:
        path, source = target, hub.cache_source(target)
        with GGUFFile(target) as f:
            general = {k: kv.value for k, kv in f.kv.items() if k.startswith("general.")}
    url = general.get(General.REPO_URL) or general.get(General.SOURCE_REPO_URL)
    declared = lic.license_from_gguf(path, general)
    repo = None
    if url:
        m = re.search(r"huggingface\.co/([\w.-]+/[\w.-]+)", url) or re.fullmatch(r"([\w.-]+/[\w.-]+)", url)
        repo = m.group(1) if m else None
    repo = repo or (source.repo if source else None)
    return _QUANT_SUFFIX.sub("", path.stem) or path.stem, repo, declared


def drafter_repo(draft_dir: Path) -> str | None:
    """The drafter's Hub repo id: from the Hub cache path, else config.json's `_name_or_path`."""
    repo = _hub_cache_repo(draft_dir)
    if repo:
        return repo
    name_or_path = str(_read_json(Path(draft_dir) / "config.json").get("_name_or_path") or "")
    return name_or_path if re.fullmatch(r"[\w.-]+/[\w.-]+", name_or_path) else None


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------

NOT_VALIDATED = "not validated"


def _not_validated(why: str) -> dict:
    return {"validated": False, "tau": None, "speedup": None, "note": f"{NOT_VALIDATED} ({why})"}


def validate_variant(target: Path | TargetInfo, draft_path: Path, settings=None) -> dict:
    """Run `validate` (runner/validate.py) on one variant beside its target, on the built-in prompts
    with `settings` (its build and llama-server arguments are the release's).

    Returns {"validated": bool, "tau": float | None, "speedup": float | None, "note": str}: tau is
    the report's `mean_acceptance_length` (tokens produced per target verification step), speedup
    tokens/s with the drafter over the target alone. A report whose verdict is not 0 (the
    speculative output differs from the target's own) raises ReleaseError, which stops the release
    and leaves nothing behind. For a target given as a folder (llama-server needs the target's
    GGUF) the card says "not validated".
    """
    from ..runner import validate as validator
    from ..runner.prompts import BUILTIN_PROMPTS

    if isinstance(target, TargetInfo):
        if target.local_gguf is None:
            return _not_validated("the target GGUF was read on the Hub without downloading it; validation runs "
                                  "a local copy")
        target = target.local_gguf
    if not Path(target).is_file():
        return _not_validated("the target was given as a folder; validation runs its GGUF")
    target, draft_path = Path(target), Path(draft_path)
    result = validator.validate(target, draft_path, list(BUILTIN_PROMPTS), settings or validator.ValidationSettings())
    if validator.verdict(result, False) != 0:
        bad = sum(1 for d in result.get("divergences", []) if d.get("kind") != "tie")
        raise ReleaseError(f"{draft_path.name}: validation failed: with the drafter, {bad} token(s) were not "
                           f"{target.name}'s own; run `dflash-gguf validate` for the report")
    speedup = result.get("speedup")
    return {"validated": True, "tau": float(result["mean_acceptance_length"]),
            "speedup": float(speedup) if speedup is not None else None, "note": "validated"}


# ---------------------------------------------------------------------------------------------
# License files
# ---------------------------------------------------------------------------------------------

@dataclass
class LicensePlan:
    card: dict                                             # license fields for the front matter
    copies: dict[str, Path] = field(default_factory=dict)  # release file name -> source file
    notice: str | None = None                              # NOTICE text to write, when needed
    combined: str | None = None                            # LICENSES.md text, when needed


def _license_files(folder: Path | None) -> list[Path]:
    if folder is None or not Path(folder).is_dir():
        return []
    found = (file_in(folder, n, "license file") for n in lic.LICENSE_FILE_NAMES)
    return [path for path in found if path is not None]


def _target_name(name: str) -> str:
    stem, dot, ext = name.partition(".")
    return f"{stem}-target{dot}{ext}"


def plan_license_files(terms: lic.Terms) -> LicensePlan:
    """Which license files the release holds and what the card's license fields say. Raises
    LicenseError (before anything is written) when a `license_link` cannot be honoured."""
    plan = LicensePlan(dict(terms.card))
    renamed: dict[tuple[str, str], str] = {}
    for role, source in (("drafter", terms.drafter), ("target", terms.target)):
        for path in _license_files(source.folder):
            name = path.name if path.name not in plan.copies else _target_name(path.name)
            plan.copies[name] = path
            renamed[role, path.name] = name
    link = plan.card.get("license_link")
    if link and link != lic.COMBINED_LICENSE_FILE and "://" not in link:
        owner = next(s for s in (terms.drafter, terms.target) if s.link == link)
        role = "drafter" if owner is terms.drafter else "target"
        if Path(link).is_absolute() or ".." in Path(link).parts:
            raise lic.LicenseError(f"{owner.source}: license_link {link!r} points outside the model folder")
        src = check_inside(owner.folder / link, owner.folder, "license_link file") if owner.folder else None
        if src is not None and src.is_file():
            base = Path(link).name  # a release is flat: the file goes to the root
            name = renamed.get((role, link)) or (base if base not in plan.copies else _target_name(base))
            plan.copies.setdefault(name, src)
            plan.card["license_link"] = name
        elif owner.repo:
            plan.card["license_link"] = f"https://huggingface.co/{owner.repo}/blob/main/{link}"
        else:
            raise lic.LicenseError(f"{owner.source}: license_link {link!r} is neither a URL nor a file of the "
                                   "model folder; give its URL in the model card")
    if terms.notice:
        parts = [p.read_text(encoding="utf-8", errors="replace").rstrip("\n")
                 for n, p in plan.copies.items() if n == "NOTICE"]
        extra = [line for line in terms.notice.splitlines() if not any(line in p for p in parts)]
        plan.notice = "\n\n".join(parts + ["\n".join(extra)] if extra else parts) + "\n"
        plan.copies.pop("NOTICE", None)
    if terms.combined:
        plan.combined = _combined_text(terms)
    return plan


def _describe(license_: lic.License) -> str:
    if license_.id == "other":
        link = license_.link or ""
        if link and "://" not in link and license_.repo:
            link = f"https://huggingface.co/{license_.repo}/blob/main/{link}"
        return f"{license_.name} ({link})" if link else str(license_.name)
    if license_.id in lic.LLAMA:
        terms = lic.LLAMA[license_.id]
        return f"{license_.id}: {terms.title} ({terms.agreement})"
    return f"{license_.id}"


def _combined_text(terms: lic.Terms) -> str:
    return (
        "# Licenses\n\n"
        "These files combine two works, and the terms of both apply to every file:\n\n"
        f"- the drafter's weights, licensed {_describe(terms.drafter)};\n"
        f"- the target's tokenizer, embedded in each GGUF, licensed {_describe(terms.target)}.\n"
    )


# ---------------------------------------------------------------------------------------------
# The model card
# ---------------------------------------------------------------------------------------------

@dataclass
class VariantResult:
    file: str
    type: str
    recipe: str | None       # None for float types (written by the converter)
    bytes: int
    sha256: str
    validation: dict
    types: dict[str, int]    # ggml type -> tensor count, as written
    off_type: list[str] = field(default_factory=list)


@dataclass
class ReleaseResult:
    folder: str
    name: str
    base_model: str
    target: str
    target_repo: str | None
    variant: str
    block_size: int
    draft_length: int
    spec_type: str
    license: dict
    files: list[str]
    variants: list[VariantResult]
    warnings: list[str]
    run_args: list[str] = field(default_factory=list)  # the launch recipe's drafter flags, for the card
    sources: dict = field(default_factory=dict)  # drafter / target: repo, revision, files and sha256
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def example_variant(variants: list[VariantResult]) -> str:
    """The file the card's command line runs: the Q8_0 variant, else the first."""
    return next((v.file for v in variants if v.type == "Q8_0"), variants[0].file)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n}"


def _hub_link(repo: str | None, text: str) -> str:
    return f"[{text}](https://huggingface.co/{repo})" if repo else f"`{text}`"


PROVENANCE_KEY = "dflash_gguf"  # the card's front matter: tool version and source revisions


def provenance_front_matter(sources: dict, types: list[str]) -> dict:
    """What a release is, machine-readable: the tool version, the variant types and, per source, the
    Hub repository, the commit and each file's sha256 (what `release --push` compares)."""
    out: dict = {"version": __version__, "types": list(types)}
    for role in ("drafter", "target"):
        src = sources.get(role) or {}
        out[role] = {k: src.get(k) for k in ("repo", "revision", "file") if src.get(k)}
        out[role]["files"] = dict(src.get("files") or {})
    return out


def _sources_section(sources: dict) -> list[str]:
    if not sources:
        return []
    lines = ["## Sources", "",
             "Converted from these files; checkpoints can change under the same name, so the exact commit "
             "and each file's SHA-256 are recorded (and in each GGUF: `general.source.*`, "
             "`general.base_model.0.*`).", "",
             "| Role | Repository | Revision | File | SHA-256 |", "|---|---|---|---|---|"]
    for role in ("drafter", "target"):
        src = sources.get(role) or {}
        if src.get("repo"):
            where = f"[{src['repo']}](https://huggingface.co/{src['repo']}/tree/{src['revision']})"
            rev = f"`{src['revision']}`"
        else:
            where, rev = f"local `{Path(src.get('path') or '').name}`", "-"
        for name, digest in (src.get("files") or {}).items():
            lines.append(f"| {role} | {where} | {rev} | {name} | `{digest or 'unknown'}` |")
    return lines + [""]


def render_card(result: ReleaseResult, terms: lic.Terms, plan: LicensePlan) -> str:
    meta: dict = dict(plan.card)
    meta["base_model"] = result.base_model
    meta["base_model_relation"] = "quantized"
    meta["tags"] = list(CARD_TAGS)
    meta["pipeline_tag"] = "text-generation"
    meta.update(terms.gating)
    meta[PROVENANCE_KEY] = provenance_front_matter(result.sources, [v.type for v in result.variants])
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, width=1000)

    base_is_repo = "/" in result.base_model
    target_label = result.target_repo or result.name
    lines = [f"# dflash-{result.name}: {result.variant} drafter GGUF for {target_label}", ""]
    if terms.built_with:
        lines += [f"**{terms.built_with}**", ""]
    lines += [
        f"{result.variant} speculative-decoding drafter "
        f"{_hub_link(result.base_model if base_is_repo else None, result.base_model)}, converted to GGUF for "
        f"llama.cpp (`--spec-type {result.spec_type}`). It drafts for {_hub_link(result.target_repo, target_label)}: "
        "it carries that model's tokenizer and borrows its token embeddings and output head at run time, "
        "so it works with that target only.",
        "",
    ]
    if terms.non_commercial:
        lines += ["> **Non-commercial use only.** These files are licensed for non-commercial use; "
                  "see the license section below.", ""]
    lines += ["## Files", "",
              "| File | Type | Recipe | Size | SHA-256 | τ (tokens / step) | Speedup |",
              "|---|---|---|---:|---|---:|---:|"]
    for v in result.variants:
        val = v.validation
        tau = f"{val['tau']:.2f}" if val.get("tau") is not None else NOT_VALIDATED
        speed = f"{val['speedup']:.2f}x" if val.get("speedup") is not None else NOT_VALIDATED
        lines.append(f"| [{v.file}](./{v.file}) | {v.type} | {v.recipe or '-'} | {_size(v.bytes)} | "
                     f"`{v.sha256}` | {tau} | {speed} |")
    used = sorted({v.recipe for v in result.variants if v.recipe})
    if used:
        lines += [""] + [f"- `{r}`: {RECIPES[r].description}." for r in used]
    lines += ["", "τ is the mean number of tokens produced per target verification step (accepted draft "
              "tokens plus the target's own); speedup is generation speed with the drafter over the target "
              "alone. Both are measured by `dflash-gguf validate` on the pinned llama.cpp.", ""]
    lines += _sources_section(result.sources)
    lines += [
        "## Run it", "",
        "```sh",
        f"llama-server -m {result.name}.gguf {' '.join(result.run_args)}",
        "```", "",
        f"`-m` is the target model's GGUF (any quantization of {target_label}). The drafter's block size is "
        f"{result.block_size}, so drafts are at most {result.draft_length} tokens long; a smaller "
        "`--spec-draft-n-max` drafts fewer tokens per step.", "",
        "## License", "",
        f"- Drafter weights ({result.base_model}): {_describe(terms.drafter)}",
        f"- Tokenizer embedded from the target ({target_label}): {_describe(terms.target)}",
        "- Both apply to every file here" + (f"; see [{lic.COMBINED_LICENSE_FILE}](./{lic.COMBINED_LICENSE_FILE})."
                                             if plan.combined else "."),
    ]
    for t in terms.llama:
        lines.append(f"- {t.title}: the agreement is at {t.agreement}; the required attribution is in "
                     "[NOTICE](./NOTICE).")
    if plan.copies:
        lines.append("- License files: " + ", ".join(f"[{n}](./{n})" for n in sorted(plan.copies)) + ".")
    lines += ["", f"Converted and quantized with dflash-gguf {__version__}.", ""]
    return f"---\n{front}---\n\n" + "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The release
# ---------------------------------------------------------------------------------------------

def parse_types(types: str | list[str]) -> list[str]:
    items = types.split(",") if isinstance(types, str) else list(types)
    out = list(dict.fromkeys(parse_type(t, "--types") for t in items if t.strip()))
    if not out:
        raise ReleaseError("--types: give at least one type, e.g. F16,Q8_0,Q4_K_M")
    return out


def is_release_file(name: str) -> bool:
    """A file name `release` writes: what --force may replace."""
    licenses = set(lic.LICENSE_FILE_NAMES) | {_target_name(n) for n in lic.LICENSE_FILE_NAMES}
    return (name in {"README.md", "NOTICE", lic.COMBINED_LICENSE_FILE} or name in licenses
            or (name.startswith("dflash-") and name.endswith(".gguf")))


def _check_destination(out_dir: Path, force: bool) -> None:
    if not out_dir.parent.is_dir():
        raise ReleaseError(f"{out_dir.parent}: folder does not exist")
    if out_dir.exists():
        if not out_dir.is_dir():
            raise ReleaseError(f"{out_dir}: exists and is not a folder")
        present = sorted(p.name for p in out_dir.iterdir())
        if present and not force:
            raise ReleaseError(f"{out_dir}: already exists; pass --force to replace it")
        foreign = [n for n in present if not is_release_file(n) or not (out_dir / n).is_file()]
        if foreign:
            more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
            raise ReleaseError(f"{out_dir}: holds {', '.join(foreign[:3])}{more}, which a release does not write; "
                               "--force only replaces an earlier release folder")


def _resolve_target(target: str | Path | hub.HubRef) -> Path | TargetInfo:
    """A local target path; a target folder named on the Hub, fetched (config, tokenizer, card);
    or a target GGUF named on the Hub, read once (in place unless it is in the cache)."""
    model = hub.as_model(target)
    if isinstance(model, hub.HubRef):
        return load_target(model) if model.is_gguf else hub.target_folder(model)
    if not model.exists():
        raise ReleaseError(f"{model}: no such target (give the target's .gguf file or its Hugging Face folder, "
                           "or a Hub repo id)")
    return model


def _publish_folder(tmp: Path, out_dir: Path) -> None:
    """Put the finished folder at out_dir; a previous out_dir is removed only once the new one is in place."""
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.old")
        os.replace(out_dir, old)
    try:
        os.replace(tmp, out_dir)
    except BaseException:
        if old is not None:
            os.replace(old, out_dir)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def release(draft_dir: str | Path, target: str | Path, types: str | list[str], out_dir: str | Path, *,
            license_id: str | None = None, target_license_id: str | None = None, name: str | None = None,
            base_model: str | None = None, recipe: str = DEFAULT_RECIPE, skip_validate: bool = False,
            backend: str | None = None, llama_bin: Path | None = None, threads: int | None = None,
            force: bool = False, server_args: tuple[str, ...] | list[str] = (),
            progress: Progress | None = None) -> ReleaseResult:
    """Convert, quantize, validate and describe one drafter as a release folder at `out_dir`.
    `backend` / `llama_bin` choose the llama.cpp build that quantizes and validates; `server_args`
    go to llama-server in each validation, as after `validate --`."""
    started = time.perf_counter()
    say = progress or (lambda _msg: None)
    shown = str(out_dir)
    out_dir = Path(os.path.abspath(out_dir))
    wanted = parse_types(types)
    rec = get_recipe(recipe)
    if server_args and skip_validate:
        raise ReleaseError("llama-server arguments after -- are for validating the variants; "
                           "--skip-validate runs no server")
    parse_server_args(server_args)  # refuse what the runner manages before any work
    check_outputs([Output(out_dir, "-o", folder=True)],
                  [Input(draft_dir, "DRAFT_DIR"), Input(target, "--target"), Input(llama_bin, "--llama-bin")])
    _check_destination(out_dir, force)
    warnings: list[str] = []

    # 0. the sources, local or fetched from the Hub (only what is read)
    draft_dir = hub.drafter_folder(draft_dir)
    if not (draft_dir / "config.json").is_file():
        raise ReleaseError(f"{draft_dir}: not a drafter checkpoint folder (no config.json)")
    target = _resolve_target(target)

    # 1. the license rules, before anything is written
    short, target_repo, declared_target = target_facts(target)
    name = safe_name(name) if name else safe_name(short)
    base_model = base_model or drafter_repo(draft_dir)
    if not base_model:
        base_model = hub.folder_name(draft_dir)
        warnings.append(f"base_model {base_model!r} is not a Hub repo id; pass --base-model ORG/NAME "
                        "so the card links the drafter it was made from")
    drafter_card = lic.read_card(draft_dir)
    target_card = lic.read_card(target) if isinstance(target, Path) and target.is_dir() else {}
    declared_drafter = lic.license_from_folder(draft_dir, base_model if "/" in base_model else None)
    drafter_license = lic.with_override(declared_drafter, license_id, "--license")
    target_license = lic.with_override(declared_target, target_license_id, "--target-license")
    terms = lic.effective_terms(drafter_license, target_license, lic.merge_gating(drafter_card, target_card))
    plan = plan_license_files(terms)
    if any(t not in FLOAT_TYPES for t in wanted):
        find_llama_quantize(llama_bin, backend)  # fail now, not after the conversion
    gguf_license = lic.License(plan.card["license"], "the release's card", plan.card.get("license_name"),
                               plan.card.get("license_link"))

    from ..runner.validate import ValidationSettings

    validation_settings = ValidationSettings(backend=backend, llama_bin=llama_bin, server_args=list(server_args))

    # 2. build everything in a temporary folder beside out_dir
    tmp = partial_name(out_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
    except OSError as err:
        raise named_for(err, out_dir) from None
    try:
        say(f"converting {hub.folder_name(draft_dir)}")
        base = tmp / ".base.gguf"
        planned = convert(draft_dir, target, base, "auto", gguf_license)
        warnings += planned.warnings
        base_type = planned.outtype.upper()
        drafter: DrafterDescription = describe(base)
        base_counts = drafter.count_by_type()
        sources = planned.provenance(hashes=True)
        variants: list[VariantResult] = []
        for qtype in wanted:
            path = tmp / variant_file(name, qtype)
            off: list[str] = []
            used_recipe = None
            if qtype == base_type:
                shutil.copyfile(base, path)
                counts = base_counts
            elif qtype in FLOAT_TYPES:
                say(f"converting {hub.folder_name(draft_dir)} as {qtype}")
                convert(draft_dir, target, path, qtype.lower(), gguf_license)
                counts = describe(path).count_by_type()
            else:
                say(f"quantizing {qtype} (recipe {rec.name})")
                q = quantize(base, path, qtype, rec.name, llama_bin, threads, backend=backend)
                counts, off, used_recipe = q.types, q.off_type, rec.name
            validation = (_not_validated("--skip-validate") if skip_validate
                          else validate_variant(target, path, validation_settings))
            if not skip_validate:
                say(f"validated {path.name}: {validation['note']}")
            variants.append(VariantResult(path.name, qtype, used_recipe, path.stat().st_size, sha256_file(path),
                                          validation, counts, off))
        base.unlink()

        for rel, src in plan.copies.items():
            shutil.copyfile(src, tmp / rel)
        if plan.notice:
            (tmp / "NOTICE").write_text(plan.notice, encoding="utf-8")
        if plan.combined:
            (tmp / lic.COMBINED_LICENSE_FILE).write_text(plan.combined, encoding="utf-8")
        result = ReleaseResult(
            folder=shown, name=name, base_model=base_model,
            target=str(target.path if isinstance(target, TargetInfo) else target), target_repo=target_repo,
            variant=drafter.variant_name, block_size=drafter.block_size, draft_length=drafter.draft_length,
            spec_type=str(drafter.spec_type), license=plan.card, files=[], variants=variants, warnings=warnings,
            run_args=speculative_args(drafter, shown_path=example_variant(variants)), sources=sources)
        (tmp / "README.md").write_text(render_card(result, terms, plan), encoding="utf-8")
        result.files = sorted(p.name for p in tmp.iterdir())
        _publish_folder(tmp, out_dir)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if err.filename is None or str(err.filename).startswith(str(tmp)):
            raise named_for(err, out_dir) from None
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    result.seconds = round(time.perf_counter() - started, 3)
    return result
