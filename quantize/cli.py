"""`dflash-gguf quantize`, and the recipe option and progress lines `release` shares."""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter
from pathlib import Path

import click

from dflash_gguf.options import OUTPUT_FILE, build_options, force_option, json_option, quantize_threads_option
from dflash_gguf.outputs import Input, Output, check_outputs
from dflash_gguf.progress import printer
from dflash_gguf.terminal import say
from .quantize import ALL_TYPES, DEFAULT_RECIPE, RECIPES
from .quantize import quantize as quantize_file

log = logging.getLogger(__name__)

RECIPE_HELP = "; ".join(f"{r.name}: {r.description}" for r in RECIPES.values())

recipe_option = click.option(
    "--recipe", type=click.Choice(list(RECIPES)), default=DEFAULT_RECIPE, show_default=True,
    help=f"Which tensors keep a higher precision. {RECIPE_HELP}.")


def progress(message: str) -> None:
    """On a terminal, a line (a refusal after it would not be the only line in a log); logged always."""
    if sys.stderr.isatty():
        printer()(message)
    log.info("%s", message)


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _counts(items) -> str:
    return ", ".join(f"{t} {n}" for t, n in sorted(Counter(items).items()))


@click.command()
@click.argument("src", metavar="IN.gguf", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("out", metavar="OUT.gguf", type=OUTPUT_FILE)
@click.option("--type", "qtype", required=True, metavar="TYPE",
              help=f"llama-quantize file type: {', '.join(ALL_TYPES)}.")
@recipe_option
@build_options
@quantize_threads_option
@force_option
@json_option
def quantize(src: Path, out: Path, qtype: str, recipe: str, backend: str | None, llama_bin: Path | None,
             quantize_threads: int | None, force: bool, as_json: bool) -> None:
    """Quantize a drafter GGUF with llama-quantize, keeping acceptance-critical tensors precise.

    IN.gguf is a drafter written by `dflash-gguf convert` (F16, BF16 or F32 tensors). The
    recipe pins the feature projection (fc.weight) and DFlash 2's selector_* and *_conv_*
    tensors to a higher precision than the rest. The result is read back and every tensor's
    type checked against the recipe before OUT.gguf appears; the report lists the types
    actually written, because llama-quantize gives rows its blocks do not divide another type
    (K-quants need rows that are a multiple of 256 values, Q8_0 and Q4_0 a multiple of 32).

    Refused with exit status 2: an input whose general.license is NoDerivatives
    (cc-by-nd-*, cc-by-nc-nd-*), an input that is already quantized, a legacy dflash-draft file.

    \b
    Examples:
      dflash-gguf quantize dflash-Qwen3-8B-F16.gguf dflash-Qwen3-8B-Q4_K_M.gguf --type Q4_K_M
      dflash-gguf quantize in.gguf out.gguf --type Q8_0 --recipe plain --json
    """
    check_outputs([Output(out, "OUT.gguf")], [Input(src, "IN.gguf"), Input(llama_bin, "--llama-bin")], force=force)
    r = quantize_file(src, out, qtype, recipe, llama_bin, quantize_threads, progress=progress, backend=backend)
    if as_json:
        click.echo(json.dumps(r.to_dict(), indent=2))
        return
    say(f"wrote {out} ({mib(r.bytes)}) as {r.type} with recipe {r.recipe} in {r.seconds:.1f} s")
    say(f"  tensor types   {_counts(t.type for t in r.tensors)}")
    kept = [t for t in r.tensors if t.role == "kept"]
    if kept:
        say(f"  kept           {len(kept)} tensors: {_counts(t.type for t in kept)}")
    main = ALL_TYPES[r.type].name
    if r.off_type:
        off = [t for t in r.tensors if t.name in set(r.off_type)]
        say(f"  not {main:<10} {len(off)} tensors: {_counts(t.type for t in off)} "
                   "(llama-quantize's mixture, or rows its blocks do not divide; --json lists them)")
    if r.fallbacks:
        say(f"  fallbacks      {len(r.fallbacks)} tensors had rows too short for the wanted type")


commands = [quantize]
