"""Quantized drafter variants through the patched build's `llama-quantize`, with recipes.

A recipe keeps the tensors acceptance depends on most (the feature projection `fc`, DFlash 2's
`selector_*` and `*_conv_*`) at a higher precision than the rest, through llama-quantize's
`--tensor-type PATTERN=TYPE` (a regex searched in each tensor name). After llama-quantize has
written the file, it is read back and every tensor's type checked against what the recipe says;
the report gives the types actually produced, since llama-quantize falls back to other types for
rows a block does not divide (K-quants need rows that are a multiple of 256 values, Q8_0/Q4_0 of 32).
The output is written to a temporary file and renamed into place only when it checks out.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT

from dflash_gguf.errors import LicenseError
from dflash_gguf.errors import QuantizeError
from dflash_gguf.gguf.describe import describe
from dflash_gguf.gguf.license import license_from_gguf
from dflash_gguf.gguf.reader import GGUFFile
from dflash_gguf.licenses import Kind
from dflash_gguf.outputs import Input, Output, check_outputs, named_for, partial_name
from dflash_gguf.progress import Progress
from dflash_gguf.runner.build import find_bin_dir, runtime_env

log = logging.getLogger(__name__)


# llama-quantize's file types this tool offers, each with the ggml type most tensors get.
# (The _M / _S mixtures give some tensors a neighbouring type; the report shows which.)
QUANT_TYPES: dict[str, QT] = {
    "Q8_0": QT.Q8_0, "Q6_K": QT.Q6_K,
    "Q5_K_M": QT.Q5_K, "Q5_K_S": QT.Q5_K, "Q5_1": QT.Q5_1, "Q5_0": QT.Q5_0,
    "Q4_K_M": QT.Q4_K, "Q4_K_S": QT.Q4_K, "Q4_1": QT.Q4_1, "Q4_0": QT.Q4_0,
    "IQ4_NL": QT.IQ4_NL, "IQ4_XS": QT.IQ4_XS,
    "Q3_K_L": QT.Q3_K, "Q3_K_M": QT.Q3_K, "Q3_K_S": QT.Q3_K, "Q2_K": QT.Q2_K,
}
# Float types: `release` writes these with the converter; `quantize` passes them to llama-quantize.
FLOAT_TYPES: dict[str, QT] = {"F32": QT.F32, "F16": QT.F16, "BF16": QT.BF16}
ALL_TYPES: dict[str, QT] = {**FLOAT_TYPES, **QUANT_TYPES}

# The tensors a recipe keeps: llama-quantize regexes (searched in the lower-case tensor name).
KEEP_PATTERNS = (r"^fc\.weight$", r"^selector_", r"_conv_")


@dataclass(frozen=True)
class Recipe:
    name: str
    keep_type: QT | None  # type of the kept tensors; None: llama-quantize's own mixture throughout
    description: str


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("plain", None, "llama-quantize's own mixture for every tensor; nothing kept"),
    Recipe("keep-fc", QT.Q8_0, "fc, selector_* and *_conv_* at Q8_0, the rest at the chosen type"),
    Recipe("keep-fc-f16", QT.F16, "fc, selector_* and *_conv_* at F16, the rest at the chosen type"),
)}
# Chosen by measurement (docs/benchmarks.md, section d: acceptance length per MiB on the trained
# pair): keeping fc/selector/conv at Q8_0 or F16 added size and bought no acceptance at any type.
DEFAULT_RECIPE = "plain"


def parse_type(name: str, option: str = "--type") -> str:
    """A type name as this tool spells it ("q4_k_m" -> "Q4_K_M"); QuantizeError when unknown."""
    key = name.strip().upper()
    if key not in ALL_TYPES:
        raise QuantizeError(f"{option} {name.strip()!r}: choose from {', '.join(ALL_TYPES)}")
    return key


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise QuantizeError(f"--recipe {name!r}: choose one of {', '.join(RECIPES)}")
    return RECIPES[name]


def is_kept(name: str) -> bool:
    return any(re.search(p, name.lower()) for p in KEEP_PATTERNS)


def is_quantizable(name: str, shape: tuple[int, ...]) -> bool:
    """Whether llama-quantize changes this tensor's type at all (its rule, for DFlash tensor names):
    only 2-D+ tensors whose name ends in `weight`, never norms."""
    return len(shape) >= 2 and name.endswith("weight") and "_norm.weight" not in name


def _block(qtype: QT) -> int:
    return GGML_QUANT_SIZES[qtype][0]


def kept_type(keep: QT, shape: tuple[int, ...]) -> QT:
    """The type llama-quantize gives a kept tensor: `keep`, or F16 where `keep`'s block does not
    divide the rows (its fallback for 32-block types)."""
    return keep if shape[-1] % _block(keep) == 0 else QT.F16


def llama_quantize_args(qtype: str, recipe: Recipe) -> list[str]:
    """The options (before the file names) that make llama-quantize follow `recipe`."""
    if recipe.keep_type is None or qtype in FLOAT_TYPES:
        return []
    keep = recipe.keep_type.name.lower()
    return [arg for pattern in KEEP_PATTERNS for arg in ("--tensor-type", f"{pattern}={keep}")]


def expected_type(name: str, shape: tuple[int, ...], source_type: QT, qtype: str, recipe: Recipe) -> QT | None:
    """The type the recipe promises for a tensor, or None where llama-quantize's mixture decides."""
    if not is_quantizable(name, shape):
        return source_type
    if qtype in FLOAT_TYPES:
        return FLOAT_TYPES[qtype]
    if recipe.keep_type is not None and is_kept(name):
        return kept_type(recipe.keep_type, shape)
    return None


# ---------------------------------------------------------------------------------------------
# Finding llama-quantize
# ---------------------------------------------------------------------------------------------

def find_llama_quantize(llama_bin: Path | None = None, backend: str | None = None) -> Path:
    """`llama-quantize` in `llama_bin`, else in the patched build for `backend`."""
    exe = find_bin_dir(backend, llama_bin) / ("llama-quantize.exe" if os.name == "nt" else "llama-quantize")
    if not exe.is_file():
        raise QuantizeError(f"{exe}: not found; --llama-bin must be the bin folder of a llama.cpp build")
    return exe


# ---------------------------------------------------------------------------------------------
# Quantizing
# ---------------------------------------------------------------------------------------------

@dataclass
class TensorReport:
    name: str
    shape: list[int]
    source_type: str
    type: str
    role: str  # "kept" (recipe keeps it at higher precision), "quantized", "unchanged" (norms, 1-D, conv bases)


@dataclass
class QuantizeResult:
    source: str
    output: str
    type: str
    recipe: str
    bytes: int
    seconds: float
    types: dict[str, int]                 # ggml type -> number of tensors, as written
    tensors: list[TensorReport]
    fallbacks: list[dict] = field(default_factory=list)  # what llama-quantize said it fell back from
    off_type: list[str] = field(default_factory=list)    # "quantized" tensors not at the type's main ggml type

    def to_dict(self) -> dict:
        return asdict(self)


_FALLBACK = re.compile(r"warning:\s+(\S+)\s+- ncols\s+(\d+) not divisible by\s+(\d+) "
                       r"\(required for type\s+(\S+)\).*?-> falling back to\s+(\S+)")


def parse_fallbacks(log_text: str) -> list[dict]:
    """llama-quantize's `falling back` warnings: tensor, row length, wanted type, type used."""
    seen, out = set(), []
    for m in _FALLBACK.finditer(log_text):
        name, ncols, _, wanted, got = m.groups()
        if name not in seen:
            seen.add(name)
            out.append({"tensor": name, "row": int(ncols), "wanted": wanted.upper(), "used": got.upper()})
    return out


_FAILURE = re.compile(r"error|failed|invalid|not a |unsupported|cannot|power of 2|wrong", re.IGNORECASE)
_GENERIC = re.compile(r"failed to quantize model from|failed to quantize: llama_model_loader: failed to load model")


def failure_reason(output: str) -> str:
    """The line of llama-quantize's output that says why it failed: the first specific complaint
    (e.g. gguf's "alignment 7 is not a power of 2"), not the generic lines it ends with."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    hits = [ln for ln in lines if _FAILURE.search(ln)]
    specific = [ln for ln in hits if not _GENERIC.search(ln)]
    return (specific or hits or lines or ["no output"])[0]


def check_input(src: Path) -> GGUFFile:
    """Open a drafter GGUF fit to quantize: one llama.cpp can run, float tensors, license allows."""
    f = GGUFFile(src)
    try:
        describe(f).require_runnable()
        quantized = sorted({t.type.name for t in f.tensors.values() if t.type not in FLOAT_TYPES.values()})
        if quantized:
            raise QuantizeError(f"{src}: already holds quantized tensors ({', '.join(quantized)}); quantize from "
                              "the F16/BF16/F32 conversion instead")
        lic = license_from_gguf(src, f)
        if lic.kind is Kind.NO_DERIVATIVES:
            raise LicenseError(f"{src}: general.license is {lic.label} (NoDerivatives): quantized copies are "
                               "adapted material the license forbids")
    except BaseException:
        f.close()
        raise
    return f


def _role(name: str, shape: tuple[int, ...], qtype: str, recipe: Recipe) -> str:
    if not is_quantizable(name, shape):
        return "unchanged"
    if recipe.keep_type is not None and qtype not in FLOAT_TYPES and is_kept(name):
        return "kept"
    return "quantized"


def _ggml_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape as ggml sees it: outer dimensions of 1 do not count (llama-quantize writes a
    [1, 288] tensor, DSpark's conf_proj, back with the one dimension ggml_n_dims gives it)."""
    dims = list(shape)
    while len(dims) > 1 and dims[0] == 1:
        dims.pop(0)
    return tuple(dims)


def verify(src: GGUFFile, out: Path, qtype: str, recipe: Recipe) -> list[TensorReport]:
    """Read the written file back: same tensors and shapes, every key kept, and each tensor of the
    type the recipe promises. Raises QuantizeError naming the first tensors that are not."""
    with GGUFFile(out) as q:
        missing = sorted(set(src.tensors) - set(q.tensors))
        extra = sorted(set(q.tensors) - set(src.tensors))
        if missing or extra:
            raise QuantizeError(f"{out}: llama-quantize changed the tensor set "
                              f"(missing {missing[:3]}, extra {extra[:3]})")
        lost = sorted(k for k in src.kv if k not in q.kv)
        if lost:
            raise QuantizeError(f"{out}: llama-quantize dropped metadata {', '.join(lost[:5])}")
        reports, wrong = [], []
        for name, t in src.tensors.items():
            got = q.tensors[name]
            if _ggml_shape(got.shape) != _ggml_shape(t.shape):
                wrong.append(f"{name} shape {list(got.shape)} != {list(t.shape)}")
                continue
            want = expected_type(name, t.shape, t.type, qtype, recipe)
            if want is not None and got.type != want:
                wrong.append(f"{name} is {got.type.name}, recipe {recipe.name} says {want.name}")
            reports.append(TensorReport(name, list(t.shape), t.type.name, got.type.name,
                                        _role(name, t.shape, qtype, recipe)))
        if wrong:
            more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
            raise QuantizeError(f"{out}: tensor types differ from recipe {recipe.name}: {'; '.join(wrong[:3])}{more}")
        return reports


def quantize(src: str | Path, out: str | Path, qtype: str, recipe: str = DEFAULT_RECIPE,
             llama_bin: Path | None = None, threads: int | None = None,
             progress: Progress | None = None, backend: str | None = None) -> QuantizeResult:
    """Quantize drafter GGUF `src` to `out` as `qtype` following `recipe`, through llama-quantize."""
    started = time.perf_counter()
    src, out = Path(src), Path(out)
    qtype, rec = parse_type(qtype), get_recipe(recipe)
    check_outputs([Output(out, "OUT.gguf")], [Input(src, "IN.gguf")], force=True)
    source = check_input(src)  # the license and the layout decide before a build is looked for
    try:
        exe = find_llama_quantize(llama_bin, backend)
    except BaseException:
        source.close()
        raise
    tmp = partial_name(out)
    try:
        cmd = [str(exe), *llama_quantize_args(qtype, rec), str(src), str(tmp), qtype]
        cmd.append(str(threads or os.cpu_count() or 1))
        if progress:
            progress(f"llama-quantize {src.name} -> {out.name} ({qtype}, recipe {rec.name})")
        log.info("running %s", " ".join(cmd))
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, errors="replace",
                              env=runtime_env(exe.parent))
        text = proc.stdout + proc.stderr
        if proc.returncode != 0 or not tmp.is_file():
            reason = failure_reason(text)
            raise QuantizeError(f"llama-quantize failed on {src} (exit {proc.returncode}): {reason}")
        reports = verify(source, tmp, qtype, rec)
        os.replace(tmp, out)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise named_for(err, out) if err.filename in (None, str(tmp)) else err from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        source.close()
    main = ALL_TYPES[qtype]
    off = [r.name for r in reports if r.role == "quantized" and r.type != main.name]
    return QuantizeResult(
        source=str(src), output=str(out), type=qtype, recipe=rec.name, bytes=out.stat().st_size,
        seconds=round(time.perf_counter() - started, 3),
        types=dict(sorted(Counter(r.type for r in reports).items())), tensors=reports,
        fallbacks=parse_fallbacks(text), off_type=off)
