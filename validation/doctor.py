"""`dflash-gguf doctor`: why is acceptance low, or the run slower than it should be?

Each check looks for one known cause and says, in one line, how to fix it:

- the files: a legacy `dflash-draft` fork file; drafter metadata older than what its family needs
  (M-RoPE sections for a target that uses M-RoPE; the sliding-window keys when the checkpoint has
  sliding-window layers, given with --checkpoint); anything else `inspect` finds wrong; a
  tokenizer embedded in the drafter that is not the target's; target layer taps the target does
  not record (its architecture records no layer inputs in the pinned llama.cpp, or the taps lie
  beyond its depth); a target of a known family (dflash_gguf/families.py) without the keys of its
  family (sliding window, rope sections);
- the server arguments: a quantized draft KV cache (acceptance collapses, llama.cpp #25725),
  `--split-mode tensor` with a DFlash 2 or DSpark drafter (aborts, #27819),
  `--spec-draft-p-min` above 0 (drafts cut short), many parallel slots (llama.cpp #27117);
- a short measured run, launched as `serve` launches it with the same arguments: tau and the
  acceptance at each draft position, against the tau of the drafter's release card (a README.md
  beside the drafter file with the table `dflash-gguf release` writes) when there is one.
"""

from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from dflash_gguf.confined_reader import file_in
from dflash_gguf.convert.converter import sliding_window
from dflash_gguf.errors import DflashError, ServerArgsError, TargetError
from dflash_gguf.families import TARGET_KEYS
from dflash_gguf.gguf import layout
from dflash_gguf.gguf.checkpoint import DrafterCheckpoint
from dflash_gguf.gguf.describe import describe
from dflash_gguf.gguf.keys import DFlash, Tokenizer
from dflash_gguf.gguf.reader import GGUFFile
from dflash_gguf.gguf.target import load_target
from dflash_gguf.runner.build import find_bin_dir
from dflash_gguf.runner.launch import check_pair, dflash_server, split_mode_problem
from dflash_gguf.runner.measure import acceptance_rate, mean_acceptance_length
from dflash_gguf.runner.prompts import Prompt, tokenize_prompts

log = logging.getLogger(__name__)

FULL_PRECISION_CACHE = frozenset({"f32", "f16", "bf16"})
MANY_SLOTS = 4
CARD_TAU_SHORTFALL = 0.8  # a measured tau under this share of the card's is a finding
MAX_CARD_TAU = 1 << 16   # tokens per step: far above any drafter's block
_TAU = re.compile(r"[0-9]{1,6}(?:\.[0-9]{1,6})?(?=\s|$)", re.ASCII)
CARD_NAME = "README.md"


@dataclass
class Finding:
    check: str  # a short name: legacy-file, mrope-sections, sliding-window, tokenizer, ...
    message: str  # what is wrong and the fix, one line

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Measured:
    """A short greedy run, launched as `serve` launches it."""
    prompts: int
    produced: int
    drafted: int
    accepted: int
    tau: float
    acceptance_rate: float
    acceptance_per_position: list[float]  # share of draft steps whose i-th drafted token was accepted

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DoctorReport:
    """What `doctor` found; `to_dict()` is what `--json` prints."""
    target: str
    draft: str
    server_args: list[str]
    findings: list[Finding]
    measured: Measured | None
    card_tau: float | None  # tau on the release card beside the drafter, when there is one

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict:
        return {"target": self.target, "draft": self.draft, "server_args": self.server_args, "ok": self.ok,
                "findings": [f.to_dict() for f in self.findings],
                "measured": self.measured.to_dict() if self.measured else None, "card_tau": self.card_tau}


def _arg(args: Sequence[str], names: Sequence[str]) -> str | None:
    """The value of the last of `names` in llama-server arguments (`--x v` or `--x=v`)."""
    value = None
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name in names:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
    return value


def check_args(args: Sequence[str]) -> list[Finding]:
    findings = []
    for names in (("-ctkd", "--cache-type-k-draft", "--spec-draft-type-k"),
                  ("-ctvd", "--cache-type-v-draft", "--spec-draft-type-v")):
        kind = _arg(args, names)
        if kind is not None and kind.lower() not in FULL_PRECISION_CACHE:
            findings.append(Finding("draft-kv-cache", f"{names[0]} {kind}: a quantized draft KV cache collapses "
                                    "acceptance (llama.cpp #25725); leave it at f16"))
    p_min = _arg(args, ("--spec-draft-p-min", "--draft-p-min"))
    try:
        if p_min is not None and float(p_min) > 0:
            findings.append(Finding("draft-p-min", f"--spec-draft-p-min {p_min}: drafts stop at the first token the "
                                    "drafter is unsure of, so fewer are accepted per step; leave it at 0"))
    except ValueError:
        raise ServerArgsError(f"--spec-draft-p-min {p_min!r}: not a number") from None
    slots = _arg(args, ("-np", "--parallel"))
    try:
        if slots is not None and int(slots) >= MANY_SLOTS:
            findings.append(Finding("parallel-slots", f"-np {slots}: acceptance drops with many slots decoding "
                                    "together (llama.cpp #27117); use -np 1 or 2 for the fastest single stream"))
    except ValueError:
        raise ServerArgsError(f"-np {slots!r}: not a number") from None
    return findings


def _tokens(path: Path) -> list[str] | None:
    with GGUFFile(path) as f:
        return f.get(Tokenizer.TOKENS)


def check_files(target: Path, draft: Path, checkpoint: Path | None = None) -> list[Finding]:
    """What is wrong with the drafter file, or with it beside this target."""
    desc = describe(draft)
    if desc.variant == layout.LEGACY:
        return [Finding("legacy-file", f"{draft.name} is a legacy dflash-draft fork file, which mainline llama.cpp "
                        f"refuses; migrate it: dflash-gguf convert {draft} -o NEW.gguf")]
    findings = [Finding("drafter-metadata", f"{draft.name}: {p}") for p in desc.problems]
    target_info = load_target(target)
    with GGUFFile(target) as t:
        target_arch = t.architecture
        target_keys = set(t.kv)
    with GGUFFile(draft) as d:
        has = set(d.kv)
    if target_info.uses_mrope and DFlash.ROPE_DIMENSION_SECTIONS not in has:
        findings.append(Finding("mrope-sections", f"{draft.name} has no {DFlash.ROPE_DIMENSION_SECTIONS} but "
                                f"{target.name} uses M-RoPE (files converted before that key existed); re-convert "
                                "it with `dflash-gguf convert`"))
    if checkpoint is not None:

        if sliding_window(DrafterCheckpoint(checkpoint)) is not None and DFlash.SLIDING_WINDOW not in has:
            findings.append(Finding("sliding-window", f"{draft.name} has no {DFlash.SLIDING_WINDOW} keys but "
                                    f"{checkpoint} has sliding-window layers, so they run with full attention; "
                                    "re-convert it with `dflash-gguf convert`"))
    target_tokens, draft_tokens = _tokens(target), _tokens(draft)
    if draft_tokens is not None and target_tokens is not None and draft_tokens != target_tokens:
        differ = next((i for i, (x, y) in enumerate(zip(draft_tokens, target_tokens)) if x != y),
                      min(len(draft_tokens), len(target_tokens)))
        findings.append(Finding("tokenizer", f"{draft.name} embeds another vocabulary than {target.name} "
                                f"({len(draft_tokens)} vs {len(target_tokens)} tokens, first difference at id {differ}); "
                                "re-convert the drafter with --target set to this target"))
    findings += check_target_family(target, target_arch, target_keys)
    try:
        check_pair(target, desc)  # gguf/drafter_fit.py: taps the target's graph does not record included
    except TargetError as err:
        taps = "target_layer_ids" in str(err) or "records no layer inputs" in str(err)
        findings.append(Finding("target-taps" if taps else "pair", str(err)))
    except DflashError as err:
        findings.append(Finding("pair", str(err)))
    return findings


def check_target_family(target: Path, arch: str | None, keys: set[str]) -> list[Finding]:
    """A target of a known family without the keys its drafters' runs depend on (dflash_gguf/families.py):
    written by an older converter, its window or rope sections are llama.cpp's defaults, not the model's."""
    missing = [f"{arch}.{key}" for key in TARGET_KEYS.get(arch, ()) if f"{arch}.{key}" not in keys]
    if not missing:
        return []
    return [Finding("target-metadata", f"{target.name} is a {arch} target without {', '.join(missing)}, so "
                    "llama.cpp runs it with defaults, not the model's own; re-convert the target with a "
                    "current convert_hf_to_gguf.py")]


def card_tau(draft: Path) -> float | None:
    """tau for this file in the release card beside it (the table `dflash-gguf release` writes)."""
    opened = file_in(draft.parent, CARD_NAME, "model card")
    if opened is None:
        return None
    try:
        text = opened.read(what="model card").decode("utf-8", errors="replace")
    finally:
        opened.close()
    header: list[str] | None = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None and any(c.startswith("τ") for c in cells):
            header = cells
        elif header is not None and cells and f"[{draft.name}]" in cells[0]:
            column = next(i for i, c in enumerate(header) if c.startswith("τ"))
            # what release writes: a decimal such as 3.41, or "-" (not validated); anything else is no tau
            match = _TAU.match(cells[column]) if column < len(cells) else None
            tau = float(match.group()) if match else None
            return tau if tau is not None and 0 < tau <= MAX_CARD_TAU else None
    return None


def measure(target: Path, draft: Path, args: Sequence[str], prompts: Sequence[Prompt], n_predict: int,
            backend: str | None, llama_bin: Path | None = None) -> Measured:
    """A short greedy run, launched as `serve` launches it: tau and acceptance per draft position."""

    server = dflash_server(target, draft, server_args=list(args), check=False,
                           bin_dir=find_bin_dir(backend, llama_bin))
    with server:
        client = server.client
        before = client.metrics()
        answers = [client.complete(ids, n_predict, temperature=0.0, cache_prompt=False)
                   for ids in tokenize_prompts(client, prompts)]
        metrics = client.metrics().since(before)
    produced = sum(c.n_predicted for c in answers)
    drafted = sum(c.draft_n for c in answers)
    accepted = sum(c.draft_n_accepted for c in answers)
    steps = metrics.drafts
    return Measured(
        prompts=len(prompts), produced=produced, drafted=drafted, accepted=accepted,
        tau=round(mean_acceptance_length(produced, accepted, len(prompts)), 4),
        acceptance_rate=round(acceptance_rate(drafted, accepted), 4),
        acceptance_per_position=[round(n / steps, 4) if steps else 0.0 for n in metrics.accepted_per_position])


def diagnose(target: str | Path, draft: str | Path, server_args: Sequence[str] = (), *, checkpoint: Path | None = None,
             prompts: Sequence[Prompt] = (), n_predict: int = 64, backend: str | None = None,
             llama_bin: Path | None = None, run: bool = True,
             progress: Callable[[str], None] | None = None) -> DoctorReport:
    """Every check, and the short measured run unless a finding blocks it or `run` is False."""
    progress = progress or (lambda msg: log.info(msg))
    target, draft = Path(target), Path(draft)
    findings = check_files(target, draft, checkpoint) + check_args(server_args)
    split = split_mode_problem(describe(draft), server_args)
    findings += [Finding("split-mode", split)] if split else []
    measured, card = None, card_tau(draft)
    blocking = {"legacy-file", "tokenizer", "target-taps", "pair", "drafter-metadata", "split-mode"}
    if run and not any(f.check in blocking for f in findings):
        progress(f"measuring: {len(prompts)} prompts, {n_predict} tokens each, greedy")
        measured = measure(target, draft, server_args, prompts, n_predict, backend, llama_bin)
        if measured.drafted and not measured.accepted:
            findings.append(Finding("acceptance", f"not one of {measured.drafted} drafted tokens was accepted: "
                                    "the drafter does not fit this target (or its metadata is wrong); check "
                                    "`dflash-gguf inspect` and re-convert"))
        elif card is not None and measured.tau < CARD_TAU_SHORTFALL * card:
            findings.append(Finding("acceptance", f"measured tau {measured.tau:.2f} is under "
                                    f"{CARD_TAU_SHORTFALL:.0%} of the release card's {card:.2f}; run with the "
                                    "card's settings (and the prompts it was trained for) to compare"))
    return DoctorReport(str(target), str(draft), list(server_args), findings, measured, card)
