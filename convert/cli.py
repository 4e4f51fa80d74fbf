"""`dflash-gguf convert` and `dflash-gguf inspect`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from dflash_gguf.errors import GGUFFormatError, OptionError
from dflash_gguf.gguf.drafter_fit import check_drafter
from dflash_gguf.gguf.describe import describe
from dflash_gguf.gguf.reader import GGUFFile
from dflash_gguf.gguf.target import load_target
from dflash_gguf.hub import resolve as hub
from dflash_gguf.hub.model_param import ModelParam
from dflash_gguf.options import force_option, json_option, license_option, out_option, target_option
from dflash_gguf.outputs import Input, Output, check_outputs
from dflash_gguf.terminal import say, shown
from .converter import OUTTYPES, convert as convert_checkpoint
from .legacy import is_legacy, migrate


class _ProgressBar:
    """A byte progress bar on stderr when it is a terminal; silent otherwise."""

    def __init__(self, label: str):
        self.label, self.bar, self.seen = label, None, 0
        self.enabled = sys.stderr.isatty()

    def __call__(self, done: int, total: int, name: str) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            self.bar = click.progressbar(length=total, label=self.label, file=sys.stderr,
                                         show_pos=False, show_percent=True, show_eta=True)
            self.bar.__enter__()
        self.bar.update(done - self.seen)
        self.seen = done

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)


def _default_out(src: Path | hub.HubRef, outtype: str) -> Path:
    """<checkpoint folder or repo name>[-TYPE].gguf, or <legacy file>-migrated.gguf (never the input's own name)."""
    if isinstance(src, Path) and src.is_file():
        return Path(f"{src.stem}-migrated.gguf")
    stem = src.repo.split("/")[-1] if isinstance(src, hub.HubRef) else src.resolve().name
    return Path(f"{stem}-{outtype.upper()}.gguf" if outtype != "auto" else f"{stem}.gguf")


@click.command()
@click.argument("src", type=ModelParam(hub_gguf_ok=False))
@target_option(required=False, folder_ok=True)
@out_option()
@click.option("--outtype", type=click.Choice(OUTTYPES), default="auto", show_default=True,
              help="Tensor type for matrices (norms and conv kernels stay F32). auto: bf16 for a bf16 "
                   "checkpoint, f16 otherwise, as upstream's converter does.")
@license_option
@force_option
@json_option
def convert(src: Path | hub.HubRef, target: Path | hub.HubRef | None, out: Path | None, outtype: str,
            license_id: str | None, force: bool, as_json: bool) -> None:
    """Convert a DFlash / DFlash 2 / DSpark drafter to the GGUF mainline llama.cpp loads.

    SRC is a drafter checkpoint folder (config.json with architectures DFlashDraftModel,
    DFlash2DraftModel or a DSpark name such as DSparkDraftModel, plus one or more .safetensors
    files, sharded through model.safetensors.index.json; FP8 exports are dequantized exactly,
    a mask_embedding.pt beside them is honoured) or its Hub repo id owner/name[@revision] (only
    its config, weights, index and card are fetched, into the Hugging Face cache), or a legacy
    fork GGUF (general.architecture = dflash-draft) to migrate without touching its tensor bytes.

    The target's GGUF gives the tokenizer (copied verbatim); its Hugging Face folder needs
    config.json and the tokenizer files, no weights. A GGUF on the Hub is read in place (only its
    metadata, by range requests). --target may be left out for a legacy GGUF. -o names the GGUF
    to write (default: <src>[-TYPE].gguf here).

    The GGUF records the drafter's and the target's Hub repository and commit when they came
    from the Hub (general.source.*, general.base_model.0.*); --json reports them, and for a
    target GGUF read in place, the bytes fetched.

    Before writing, the drafter is checked against the target: hidden size, target layer ids
    within the target's depth, vocabulary size, mask token, and DFlash 2 shapes llama.cpp would
    reject. Any problem ends with one line on stderr, exit status 2, and no output file.

    \b
    Examples:
      dflash-gguf convert Qwen3-8B-DFlash-b16/ --target Qwen3-8B-Q4_K_M.gguf -o dflash-Qwen3-8B-F16.gguf
      dflash-gguf convert z-lab/Qwen3-8B-DFlash-b16 --target unsloth/Qwen3-8B-GGUF:Q4_K_M
      dflash-gguf convert old-dflash-draft.gguf -o dflash-migrated.gguf
    """
    started = time.perf_counter()
    out = out or _default_out(src, outtype)
    check_outputs([Output(out, "-o")], [Input(src, "SRC"), Input(target, "--target")], force=force)
    bar = _ProgressBar(f"writing {shown(out.name)}")
    try:
        if isinstance(src, Path) and src.is_file():
            if outtype not in ("auto",):
                raise OptionError("--outtype applies to checkpoints; a legacy GGUF is migrated as it is")
            with GGUFFile(src) as probe:
                if not is_legacy(probe):
                    raise GGUFFormatError(
                        f"{src}: general.architecture is {probe.architecture!r}; only legacy 'dflash-draft' files "
                        "are migrated (a checkpoint is given as its folder)")
            warnings = migrate(src, out, load_target(target) if target else None, progress=bar)
            summary = {"source": str(src), "kind": "legacy migration", "output": str(out)}
        else:
            if target is None:
                raise OptionError("--target is required for a checkpoint: give the target's GGUF or its HF folder")
            planned = convert_checkpoint(src, target, out, outtype, license_id, progress=bar)
            warnings = planned.warnings
            summary = {"source": str(src), "kind": "checkpoint", "variant": planned.variant,
                       "outtype": planned.outtype, "output": str(out), **planned.provenance()}
    finally:
        bar.close()
    summary.update(bytes=out.stat().st_size, seconds=round(time.perf_counter() - started, 3), warnings=warnings)
    for message in warnings:
        say(f"warning: {message}", err=True)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        say(f"wrote {out} ({summary['bytes'] / 2**20:.1f} MiB) in {summary['seconds']:.1f} s")


def _print_report(r: dict, list_tensors: bool) -> None:
    say(f"{r['file']}")
    say(f"  variant         {r['variant']} (general.architecture = {r['architecture']})")
    default = "" if r["block_size_in_file"] else ", llama.cpp's default: the file sets none"
    spec = f", --spec-type {r['spec_type']}" if r["spec_type"] else ""
    say(f"  block size      {r['block_size']}  (draft length {r['draft_length']}{spec}{default})")
    runs = r["runs_on"]
    say(f"  runs on         {runs['text']}")
    tl = r["target_layers"]
    say(f"  target layers   HF {tl['hf']}  ->  llama.cpp {tl['llama_cpp']}")
    say(f"  mask token      {r['mask_token_id']}   vocabulary {r['vocab_size']}")
    if r["sliding_window"] is not None or r["sliding_window_pattern"] is not None:
        say(f"  sliding window  {r['sliding_window']}  pattern {r['sliding_window_pattern']}")
    if r["causal"] is not None:
        say(f"  causal          {r['causal']}")
    if r["license"]:
        say(f"  license         {r['license']}")
    for role, src in r["sources"].items():
        at = f" @ {src['revision']}" if src.get("revision") else ""
        say(f"  {role + ' from':<15} {src.get('repo_url', '(no repository recorded)')}{at}")
    sizes = ", ".join(f"{t} {b / 2**20:.2f} MiB" for t, b in sorted(r["bytes_by_type"].items()))
    say(f"  tensors         {r['tensor_count']}: {sizes}")
    for t in r["tensors"] if list_tensors else []:
        say(f"    {t['name']:<36} {t['type']:<6} {str(t['shape']):<18} {t['bytes']:>12,}")
    if r["problems"]:
        say("  problems:")
        for p in r["problems"]:
            say(f"    - {p}")
    else:
        say("  problems        none found")
    if r.get("target"):
        say(f"  fits target     {r['target']['file']}")


@click.command(short_help="Describe a drafter GGUF: variant, draft length, taps, which llama.cpp runs it, its problems.")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@json_option
@click.option("--tensors", "list_tensors", is_flag=True, help="List every tensor with its type, shape and size.")
@target_option(required=False, folder_ok=True)
def inspect(file: Path, as_json: bool, list_tensors: bool, target) -> None:
    """Describe a drafter GGUF: variant (DFlash / DFlash 2 / DSpark / legacy), block size, draft
    length and --spec-type as llama-server runs it, which llama.cpp runs it (stock llama.cpp, or a
    build with one of dflash-gguf's patches: measured, dflash_gguf/gguf/llama_support.py), target layers in both numberings (HF
    hidden-state ids and llama.cpp's shifted ids), mask token, tensor types and sizes, and the
    problems it can see (legacy layout, sliding-window layers without window metadata, missing
    keys or tensors). The JSON report (--json) always lists every tensor.

    With --target, the drafter is also checked against that target as `convert` and `serve` check
    it, and as llama-server would: hidden size, target layers (in range, and recorded by the
    target's llama.cpp graph: most architectures do not record the last layer's output),
    vocabulary, mask token; a drafter that does not fit is refused in one line.

    Exit status 0 when no problem is found, 1 when problems are listed, 2 when the file is not a
    readable GGUF or does not fit --target.

    \b
    Examples:
      dflash-gguf inspect dflash-Qwen3-8B-F16.gguf
      dflash-gguf inspect dflash-Qwen3-8B-F16.gguf --json --tensors
      dflash-gguf inspect dflash-Qwen3-8B-F16.gguf --target Qwen3-8B-Q4_K_M.gguf
    """
    desc = describe(file)
    report = desc.to_dict()
    if target is not None:
        info = load_target(target)
        warnings = check_drafter(desc.facts(), info)
        report["target"] = {"file": str(info.path), "fits": True, "warnings": warnings}
        for message in warnings:
            say(f"warning: {message}", err=True)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print_report(report, list_tensors)
    sys.exit(1 if report["problems"] else 0)


commands = [convert, inspect]
