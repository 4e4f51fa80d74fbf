"""The release's model card: front matter (license, base_model, tags, gating fields, the provenance
block `release --push` compares), the table of variants, the sources, how to run them, the license section."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import re

import yaml

from dflash_gguf import __version__
from dflash_gguf.errors import ReleaseError
from dflash_gguf.hub.names import commit_id
from dflash_gguf.quantize.quantize import RECIPES
from . import license_rules as lic
from .license_files import LicensePlan

CARD_TAGS = ["gguf", "llama.cpp", "dflash", "speculative-decoding"]
NOT_VALIDATED = "not validated"
NOT_RELIABLE = "not measured reliably"


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
    file_prefix: str = "dflash"  # dflash / dspark: what the variant files' names start with
    sidecar_of: str | None = None  # the GGUF repository the variants are placed in, beside its quants
    sidecar_quant: str | None = None  # the quant of that repository the drafter was converted against
    runs_on: dict = field(default_factory=dict)  # which llama.cpp runs the files (dflash_gguf/gguf/llama_support.py)
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
        if "repo" in out[role]:  # read on the Hub: the exact commit, never what a server called one
            commit_id(src.get("revision"), src["repo"], f"the {role}'s revision", ReleaseError)
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


def _runs_on(runs_on: dict) -> list[str]:
    """Which llama.cpp runs the files, as the stock conformance test measured it."""
    if not runs_on:
        return []
    measured = (f"measured by dflash-gguf's conformance test against stock llama.cpp "
                f"(PyPI `{runs_on['measured_on']}`) beside its patched build")
    if runs_on["stock"]:
        return [f"**Runs on {runs_on['text']}** (`--spec-type`, no patch needed; {measured}).", ""]
    patches = ", ".join(f"`ggml_patches/{p}`" for p in runs_on["patches"])
    return [f"> **This file {runs_on['text']}**: stock llama.cpp does not load it ({measured}). Build one "
            f"with `dflash-gguf llama build` (the pinned llama.cpp with {patches}), or apply the patch to your "
            "own llama.cpp tree.", ""]


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
    lines = [f"# {result.file_prefix}-{result.name}: {result.variant} drafter GGUF for {target_label}", ""]
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
        speed = (f"{val['speedup']:.2f}x" if val.get("speedup") is not None else
                 NOT_RELIABLE if val.get("speedup_unreliable") else NOT_VALIDATED)
        lines.append(f"| [{v.file}](./{v.file}) | {v.type} | {v.recipe or '-'} | {_size(v.bytes)} | "
                     f"`{v.sha256}` | {tau} | {speed} |")  # read back by recorded_sha256
    used = sorted({v.recipe for v in result.variants if v.recipe})
    if used:
        lines += [""] + [f"- `{r}`: {RECIPES[r].description}." for r in used]
    lines += ["", "τ is the mean number of tokens produced per target verification step (accepted draft "
              "tokens plus the target's own); speedup is generation speed with the drafter over the target "
              "alone, the median of interleaved rounds, given only where the rounds support it (never above "
              "τ, never a range wider than the effect). Both are measured by `dflash-gguf validate` on the "
              "pinned llama.cpp.", ""]
    lines += _sources_section(result.sources)
    lines += ["## Run it", ""] + _runs_on(result.runs_on) + [
        "```sh",
        f"llama-server -m {result.name}.gguf {' '.join(result.run_args)}",
        "```", "",
    ]
    if result.sidecar_of:
        lines += [
            f"These files sit beside the quantizations of [{result.sidecar_of}](https://huggingface.co/"
            f"{result.sidecar_of}), so llama.cpp downloads the matching one by itself:", "",
            "```sh",
            f"llama-server -hf {result.sidecar_of}" + (f":{result.sidecar_quant}" if result.sidecar_quant else "")
            + f" --spec-type {result.spec_type}",
            "```", "",
        ]
    lines += [
        f"`-m` is the target model's GGUF (any quantization of {target_label}). The drafter's block size is "
        f"{result.block_size}, so drafts are at most {result.draft_length} tokens long; a smaller "
        "`--spec-draft-n-max` drafts fewer tokens per step.", "",
        "## License", "",
        f"- Drafter weights ({result.base_model}): {lic.describe_license(terms.drafter)}",
        f"- Tokenizer embedded from the target ({target_label}): {lic.describe_license(terms.target)}",
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


# a row of the Files table above: | [file](./file) | type | recipe | size | `sha256` | ...
_RECORDED = re.compile(r"^\|\s*\[[^\]]*\]\(\./([^)\s#?]+)\)\s*\|[^\n]*?`([0-9a-fA-F]{64})`", re.MULTILINE)


def recorded_sha256(body: str) -> dict[str, set[str]]:
    """The sha256 a card's Files table records for each file it lists (what `publish` checks)."""
    found: dict[str, set[str]] = {}
    for name, digest in _RECORDED.findall(body):
        found.setdefault(name, set()).add(digest.lower())
    return found
