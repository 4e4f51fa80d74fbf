"""`dflash-gguf doctor`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from dflash_gguf.progress import printer
from dflash_gguf.terminal import shown
from dflash_gguf.hub import resolve as hub
from dflash_gguf.options import (ServerArgsCommand, build_options, draft_option, json_option, n_predict_option,
                       prompts_option, rpc_option, target_option)
from dflash_gguf.runner.launch import with_rpc
from dflash_gguf.runner.prompts import BUILTIN_PROMPTS, read_prompts
from .doctor import diagnose


@click.command("doctor", cls=ServerArgsCommand)
@target_option()
@draft_option()
@click.option("--checkpoint", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="The drafter's HF checkpoint folder: also check the GGUF against what it needs (sliding window).")
@prompts_option()
@n_predict_option()
@click.option("--no-run", is_flag=True, help="Only the checks of files and arguments; start no server.")
@build_options
@rpc_option
@json_option
def doctor_command(target, draft, checkpoint, prompts_file, n_predict, no_run, backend, llama_bin, rpc, as_json,
                   server_args) -> None:
    """Why is acceptance low, or the run slower than it should be?

    Checks the drafter file (legacy dflash-draft layout; metadata older than its family needs:
    M-RoPE sections, and with --checkpoint the sliding-window keys; whatever `inspect` finds),
    the pair (the drafter's embedded tokenizer against the target's; target layer taps the target
    does not record; a target of a known family without its family's sliding-window or rope-section
    keys), the llama-server arguments after `--` (a quantized draft KV cache, llama.cpp
    #25725; --spec-draft-p-min; many parallel slots, #27117), then measures a short greedy run
    launched as `serve` launches it with those arguments: tau and the acceptance at each draft
    position, against the tau of the release card (README.md) beside the drafter when there is one.
    Each finding is one line with its fix.

    Exit status: 0 when nothing is wrong, 1 when something is, 2 on bad input.

    \b
    Examples:
      dflash-gguf doctor -t Qwen3-8B-Q4_K_M.gguf -d dflash-Qwen3-8B-F16.gguf
      dflash-gguf doctor -t Qwen3-8B-Q4_K_M.gguf -d dflash-Qwen3-8B-F16.gguf --checkpoint Qwen3-8B-DFlash-b16/
      dflash-gguf doctor -t Qwen3-8B-Q4_K_M.gguf -d dflash-Qwen3-8B-F16.gguf --json -- -ctkd q8_0 -np 8
    """
    target = hub.local_gguf(target)
    prompts = read_prompts(prompts_file) if prompts_file else list(BUILTIN_PROMPTS)
    server_args = with_rpc(rpc, server_args)
    report = diagnose(target, draft, list(server_args), checkpoint=checkpoint, prompts=prompts, n_predict=n_predict,
                      backend=backend, llama_bin=llama_bin, run=not no_run, progress=printer())
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for f in report.findings:
            click.echo(shown(f"{f.check:<16} {f.message}"))  # values from files, escaped
        m = report.measured
        if m is not None:
            per_position = " ".join(f"{x:.2f}" for x in m.acceptance_per_position)
            card = f" (release card: {report.card_tau:.2f})" if report.card_tau is not None else ""
            click.echo(f"measured         tau {m.tau:.2f}{card}, acceptance {m.acceptance_rate:.2f}; "
                       f"per draft position: {per_position}")
        if report.ok:
            click.echo("nothing wrong found")
    sys.exit(0 if report.ok else 1)


commands = [doctor_command]
