"""`dflash-gguf train`."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import click

from dflash_gguf.extras import require
from dflash_gguf.hub import resolve as hub
from dflash_gguf.hub.resolve import HubRef
from dflash_gguf.options import (build_options, force_option, json_option, out_option, prompts_option, seed_option,
                       target_option, threads_option)
from dflash_gguf.outputs import Input, Output, check_outputs
from dflash_gguf.progress import BEAT, printer
from dflash_gguf.settings import Settings, option, refusal, settings_command
from dflash_gguf.variants import VARIANTS, Variant

TRAINED = tuple(v.value for v, row in VARIANTS.items() if row.block_size)  # what --variant takes


def _layer_list(_ctx, _param, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        ids = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r}: give layer ids separated by commas, e.g. 1,14,27") from None
    if len(set(ids)) != len(ids) or sorted(ids) != list(ids):
        raise click.BadParameter(f"{value!r}: give each layer once, in increasing order")
    return ids


class _StepBar:
    """The training progress on stderr: rewritten in place on a terminal, a line every BEAT seconds
    otherwise (so the heartbeat never needs to speak between them)."""

    def __init__(self, block_size: int, blocks_per_step: int):
        self.tokens_per_step = (block_size - 1) * blocks_per_step
        self.printer = printer()
        self.tty, self.last = self.printer.tty(), 0.0

    def __call__(self, step: int, steps: int | None, running: dict, seconds: float, first: int) -> None:
        done = step + 1 - first
        now = time.time()
        if not (self.tty or now - self.last >= BEAT or step + 1 == steps):
            return
        self.last = now
        rate = done * self.tokens_per_step / max(seconds, 1e-9)
        left = int(seconds / done * (steps - step - 1)) if steps else 0
        eta = f"{left // 60}:{left % 60:02d}" if steps else "sizing the run from the first steps"
        line = (f"train: step {step + 1}/{steps or '?'}  loss {running.get('ce', 0):.3f}  "
                f"accepted/block {running.get('accept', 0):.2f}  {rate:,.0f} tokens/s  ETA {eta}")
        self.printer.status(line)
        if step + 1 == steps:
            self.printer.end_status()


@dataclass(frozen=True, kw_only=True)
class TrainSettings(Settings):
    """`dflash-gguf train`'s options as given, checked together (dflash_gguf/settings.py); `options()` is
    what the pipeline takes (train/pipeline.py TrainOptions, which needs torch)."""

    target: Path | HubRef
    prompts_file: Path = option("--prompts")
    out: Path = option("-o")
    variant: str
    layers: int | None
    block_size: int | None
    target_layers: tuple[int, ...] | None
    init: Path | None
    minutes: float | None
    steps: int | None
    lr: float | None
    answer_tokens: int
    holdout: float
    eval_prompts: Path | None
    eval_tokens: int
    no_validate: bool
    threads: int | None
    seed: int | None
    torch_device: str
    checkpoint_minutes: float
    backend: str | None
    llama_bin: Path | None
    force: bool
    as_json: bool = option("--json", False)

    def problems(self) -> Iterator[str]:
        yield from refusal(require, "reference", "dflash-gguf train (the z-lab drafter classes, trained with torch)")
        if self.init is not None and (self.layers or self.block_size or self.target_layers
                                      or self.variant != Variant.DFLASH):
            yield ("--init: the drafter's shape comes from its config.json; leave out --variant, --layers, "
                   "--block-size and --target-layers")
        if self.minutes is not None and self.steps is not None:
            yield "--minutes and --steps: give one"
        yield from refusal(check_outputs, [], [Input(self.target, "--target"), Input(self.prompts_file, "--prompts"),
                                               Input(self.init, "--init"), Input(self.eval_prompts, "--eval-prompts")])
        yield from refusal(check_outputs, [Output(self.out, "-o", folder=True)],
                           [Input(self.target, "--target"), Input(self.init, "--init")])

    def options(self):
        """The pipeline's TrainOptions."""
        # extra: [train] (PyTorch): the command line starts without it
        from .pipeline import SEED, TrainOptions

        return TrainOptions(variant=self.variant, layers=self.layers, block_size=self.block_size,
                            target_layer_ids=self.target_layers, init=self.init,
                            minutes=self.minutes if self.minutes or self.steps else 10.0, steps=self.steps,
                            lr=self.lr, answer_tokens=self.answer_tokens, holdout=self.holdout,
                            eval_prompts=self.eval_prompts, eval_tokens=self.eval_tokens, threads=self.threads,
                            seed=SEED if self.seed is None else self.seed,
                            checkpoint_minutes=self.checkpoint_minutes, validate=not self.no_validate,
                            device=self.torch_device, llama_bin=self.llama_bin, backend=self.backend)


@click.command("train")
@target_option()
@prompts_option(required=True)
@out_option(required=True, folder=True)
@click.option("--variant", type=click.Choice(TRAINED), default=Variant.DFLASH.value, show_default=True)
@click.option("--layers", type=click.IntRange(1, 16), help="Drafter layers. Default: as published drafters of a "
              "target that size (5 for billion-parameter targets, 2 below).")
@click.option("--block-size", type=click.IntRange(2, 64), help="Draft block. Default: "
              + ", ".join(f"{VARIANTS[v].block_size} ({VARIANTS[v].title})" for v in TRAINED) + ".")
@click.option("--target-layers", callback=_layer_list, metavar="IDS",
              help="The target layers the drafter reads (HF numbering, comma-separated). Default: z-lab's spacing.")
@click.option("--init", "init", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Start from this drafter checkpoint (z-lab layout) instead of scratch; its shape is kept.")
@click.option("--minutes", type=click.FloatRange(0.1),
              help="Training time (the teacher's comes before it). Default 10.")
@click.option("--steps", type=click.IntRange(1), help="Training steps instead of --minutes (reproducible).")
@click.option("--lr", type=click.FloatRange(1e-6, 1.0), help="Peak learning rate (AdamW: 50 warm-up steps, then "
              "cosine to a tenth). Default: the variant's recipe (the SmolLM2 drafters'; the card and --json say "
              "which); a drafter as small as the zoo's (64 wide) learns faster at about twice it.")
@click.option("--answer-tokens", type=click.IntRange(8, 4096), default=128, show_default=True,
              help="The target's greedy answer per prompt, at most this long.")
@click.option("--holdout", type=click.FloatRange(0.01, 0.5), default=0.1, show_default=True,
              help="Share of the prompts held out to measure tau on (without --eval-prompts).")
@click.option("--eval-prompts", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Measure tau on these prompts instead (same formats); they are never trained on.")
@click.option("--eval-tokens", type=click.IntRange(1, 4096), default=64, show_default=True,
              help="New tokens per held-out prompt in the measurement.")
@click.option("--no-validate", "no_validate", is_flag=True, help="Skip the held-out llama.cpp measurement.")
@threads_option
@seed_option
@click.option("--torch-device", type=click.Choice(("auto", "cpu", "cuda", "mps")), default="auto",
              show_default=True, help="Where torch trains the drafter (the teacher runs on --backend's build): auto "
              "takes cuda when torch sees an NVIDIA GPU, mps on Apple silicon, else cpu.")
@click.option("--checkpoint-minutes", type=click.FloatRange(0.0), default=3.0, show_default=True,
              help="How often training saves its state (0: after every step).")
@build_options
@force_option
@json_option
@settings_command(TrainSettings)
def train_command(settings: TrainSettings) -> None:
    """Train a DFlash drafter for the GGUF you run, with llama.cpp as the teacher.

    The patched llama.cpp answers the prompts greedily with the target (rendered by its chat
    template) and records its layer inputs at the drafter's taps and its 32 most likely next
    tokens, streamed to a disk cache; torch then trains the drafter alone, the target's embedding
    and head frozen from the GGUF (no Hugging Face checkpoint, no transformers model). Training
    checkpoints every few minutes: rerun the same command after a kill or Ctrl-C and it continues.
    -o gets a z-lab-layout checkpoint (config.json with dflash_config, model.safetensors, a
    README.md card) written whole when training ends; then held-out tau is measured by llama.cpp itself
    (a greedy `validate` pass on prompts not trained on) and written to the drafter's card.

    \b
      dflash-gguf train -t SmolLM2-135M-Instruct-Q4_K_M.gguf --prompts chats.jsonl -o my-drafter --minutes 30
      dflash-gguf convert my-drafter --target SmolLM2-135M-Instruct-Q4_K_M.gguf -o dflash-SmolLM2.gguf
    """
    # extra: [train] (PyTorch): the command line starts without it
    from .pipeline import train
    from .settings import VARIANTS as RECIPES

    target = hub.local_gguf(settings.target)
    spec = RECIPES[settings.variant]
    bar = _StepBar(settings.block_size or spec["block_size"], spec["seqs_per_step"] * spec["anchors_per_seq"])
    summary = train(target, settings.prompts_file, settings.out, settings.options(), force=settings.force,
                    progress=printer(), step_progress=bar)
    if settings.as_json:
        click.echo(json.dumps({"out": str(settings.out), **asdict(summary)}, indent=2))
        return
    held = summary.held_out
    click.echo(f"drafter        {settings.out} ({summary.variant}, {summary.layers} layers, "
               f"block {summary.block_size}, taps {summary.target_layer_ids})")
    reused = " (answers reused from an earlier run)" if summary.teacher_reused else ""
    click.echo(f"teacher        {summary.prompts_trained} prompts, {summary.teacher_seconds:.0f} s{reused}, "
               f"{summary.teacher_store_bytes / 2**20:.0f} MiB of states on disk")
    click.echo(f"training       {summary.steps} steps (peak lr {summary.lr:g}) in {summary.train_seconds:.0f} s from "
               f"{summary.initialised_from} on {summary.device}; peak memory {summary.peak_rss_bytes / 2**20:.0f} MiB")
    if held:
        click.echo(f"held-out tau   {held['tau']:.3f} on {held['prompts']} prompts x {held['n_predict']} tokens "
                   f"(llama.cpp {held['llama']}); lossless: {'yes' if held['lossless'] else 'NO'}")


commands = [train_command]
