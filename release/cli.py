"""`dflash-gguf release` and `dflash-gguf publish`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from dflash_gguf.hub.model_param import ModelParam
from dflash_gguf.options import (ServerArgsCommand, build_options, exact_option, force_option, json_option, license_option,
                       out_option, quantize_threads_option, target_option)
from dflash_gguf.quantize.cli import mib, progress, recipe_option
from dflash_gguf.quantize.quantize import ALL_TYPES
from dflash_gguf.settings import settings_command
from dflash_gguf.terminal import say
from .publish import publish as publish_folder
from .push import push_release
from .release import ReleaseSettings
from .release import release as build_release
from .sidecar import release_into


@click.command(cls=ServerArgsCommand)
@click.argument("draft_dir", metavar="DRAFT_DIR", type=ModelParam(file_ok=False, hub_gguf_ok=False))
@target_option(required=False, folder_ok=True)
@click.option("--types", default="F16,Q8_0,Q4_K_M", show_default=True, metavar="T1,T2,...",
              help=f"Variants to write, comma-separated: {', '.join(ALL_TYPES)}.")
@out_option(folder=True, dest="out_dir")
@click.option("--push", "push_repo", metavar="ORG/NAME",
              help="Upload the release to this Hub model repository in one commit, unless it already holds a "
                   "release of the same source revisions, types and dflash-gguf version (then nothing is done; "
                   "--force redoes it).")
@click.option("--into", "into_repo", metavar="ORG/NAME",
              help="Sidecar mode: commit the variants into this GGUF repository of the target, beside its own "
                   "quant files, named so that `llama-server -hf ORG/NAME:QUANT --spec-type draft-dflash` finds "
                   "them; the card and license files go into the folder <prefix>-<Target>/ and the repository's "
                   "README.md is left alone. The target defaults to the quant -hf runs by default (Q4_K_M, "
                   "else Q8_0, else the first). Skipped when it already holds this release (--force redoes it).")
@license_option
@click.option("--target-license", "target_license_id", metavar="ID",
              help="The target's Hub license id, when its README.md / general.license declares none or an "
                   "unknown one. It never overrides a declared license.")
@click.option("--name", metavar="NAME",
              help="The <Target> part of the file names dflash-<Target>-<QUANT>.gguf (default: the target's "
                   "repo or file name, quantization suffix removed).")
@click.option("--base-model", metavar="ORG/NAME",
              help="The drafter's Hub repo for the card's base_model (default: from the Hub cache path or "
                   "config.json's _name_or_path).")
@recipe_option
@click.option("--skip-validate", is_flag=True,
              help="Do not run the variants beside the target; the card says \"not validated\".")
@build_options
@quantize_threads_option
@force_option
@exact_option
@json_option
@settings_command(ReleaseSettings)
def release(settings: ReleaseSettings) -> None:
    """Build a release folder: every variant, a model card and the license files.

    Converts DRAFT_DIR (a checkpoint folder, or its Hub repo id owner/name[@revision]) against
    the target, quantizes each requested type with the recipe, validates each variant beside
    the target (unless --skip-validate) as `validate` does, on the same build (--backend /
    --llama-bin) and with the llama-server arguments after `--`, and writes the folder -o names
    (required unless --push or --into is given; then a temporary folder is used). The target is
    its GGUF or its Hugging Face folder (config.json, tokenizer, README.md); variants are
    validated beside a GGUF target only, and one named on the Hub only when it is in the Hugging
    Face cache (else only its metadata is read, in place).

    \b
      OUT/dflash-<Target>-<QUANT>.gguf  one file per type
      OUT/README.md                     card: license, base_model, base_model_relation:
                                        quantized, tags, gating fields, a table of variants
                                        (size, sha256, acceptance, speedup), how to run it,
                                        the sources (Hub repository, commit, each file's sha256)
      OUT/NOTICE                        when a Llama license applies
      OUT/LICENSE...                    license files found in the drafter / target folders

    The terms are the drafter's and the target's together (the GGUF embeds the target's
    tokenizer). Refused with exit status 2, writing nothing: a NoDerivatives license on either
    side; a missing or unknown license unless --license / --target-license names it.
    Non-commercial licenses are carried to the card; Llama licenses add "Built with Llama",
    the agreement's link and NOTICE.

    With --push ORG/NAME the release is committed to that repository (HF_TOKEN), unless its
    card already records this release: the same drafter and target commits (or, for local
    sources, the same file sha256s), the requested types and this dflash-gguf version. That
    check needs only the Hub's model info, so nothing is downloaded or built when it matches;
    --force releases again. Without --push, --force replaces an earlier release folder: only one
    whose .dflash-gguf-manifest.json records every file in it, unchanged since release wrote it;
    a folder holding anything else, or made before these records, is refused and left as it is.

    \b
    Examples:
      dflash-gguf release Qwen3-8B-DFlash-b16/ --target Qwen3-8B-Q4_K_M.gguf \\
          --types F16,Q8_0,Q4_K_M -o release/ --target-license apache-2.0
      dflash-gguf release z-lab/Qwen3-8B-DFlash-b16 --target unsloth/Qwen3-8B-GGUF:Q4_K_M \\
          --types Q8_0 --push my-org/Qwen3-8B-DFlash-GGUF
      dflash-gguf release z-lab/Qwen3-8B-DFlash-b16 --into my-org/Qwen3-8B-GGUF --types Q8_0,Q4_K_M
    """

    if settings.into_repo is not None:
        placed = release_into(settings, progress=progress)
        _report_upload(placed, settings.into_repo, settings.as_json, placed.files,
                       [f"{path} removed (an earlier variant this release does not have)" for path in placed.removed])
        return
    if settings.push_repo is not None:
        pushed = push_release(settings, progress=progress)
        _report_upload(pushed, settings.push_repo, settings.as_json,
                       [f["path"] for f in pushed.publish.files] if pushed.publish else [])
        return
    r = build_release(settings, progress=progress)
    for message in r.warnings:
        say(f"warning: {message}", err=True)
    if settings.as_json:
        click.echo(json.dumps(r.to_dict(), indent=2))
        return
    license_label = r.license.get("license_name") or r.license["license"]
    say(f"wrote {settings.out_dir} in {r.seconds:.1f} s  (license {license_label})")
    for v in r.variants:
        note = v.validation.get("note", "")
        say(f"  {v.file:<48} {mib(v.bytes):>10}  {v.recipe or '-':<12} {note}")
    others = [f for f in r.files if not f.endswith(".gguf")]
    say(f"  and {', '.join(others)}")


def _report_upload(result, repo: str, as_json: bool, files: list[str], notes: list[str] = ()) -> None:
    """What `--push` / `--into` did: skipped (and why), or the commit and the files in it."""
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    elif result.skipped:
        say(f"nothing to do: {result.reason}")
    else:
        say(f"{result.reason} {len(files)} files to {repo}: {result.publish.commit_url}")
        for line in [*files, *notes]:
            say(f"  {line}")


@click.command()
@click.argument("folder", metavar="DIR", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--repo", required=True, metavar="ORG/NAME", help="The Hub model repository (created if missing).")
@click.option("--private", is_flag=True, help="Create the repository private (an existing one keeps its visibility).")
@click.option("--dry-run", is_flag=True, help="Check the folder and list the commit's files; send nothing.")
@click.option("--message", "-m", metavar="TEXT", help="Commit message (default: 'Upload N files with dflash-gguf').")
@json_option
def publish(folder: Path, repo: str, private: bool, dry_run: bool, message: str | None, as_json: bool) -> None:
    """Upload a release folder to the Hugging Face Hub in one commit.

    DIR is a folder written by `dflash-gguf release`. It is checked first: its README.md must
    declare a license that allows sharing (never NoDerivatives, never missing or unknown), a
    Llama license needs its NOTICE file, a license_link naming a file needs that file, and the
    drafters must be dflash-*.gguf files at the root, never split. Then the repository is
    created if needed and every file is committed at once (HfApi.create_commit), so the
    repository is never visible without its card and license.

    The token is huggingface_hub's (HF_TOKEN, or the login stored by `hf auth login`); it is
    never printed. HF_ENDPOINT selects another Hub.

    \b
    Examples:
      dflash-gguf publish release/ --repo my-org/Qwen3-8B-DFlash-GGUF --dry-run
      dflash-gguf publish release/ --repo my-org/Qwen3-8B-DFlash-GGUF --private
    """

    r = publish_folder(folder, repo, private=private, dry_run=dry_run, message=message)
    if as_json:
        click.echo(json.dumps(r.to_dict(), indent=2))
        return
    verb = "would commit" if dry_run else "committed"
    say(f"{verb} {len(r.files)} files ({mib(r.total_bytes)}) to {repo}"
               + (" (private)" if private else ""))
    for f in r.files:
        say(f"  {f['path']:<52} {f['bytes']:>14,} bytes")
    if r.skipped:
        say(f"  left out (hidden): {', '.join(r.skipped)}")
    if r.commit_url:
        say(f"commit {r.commit_url}")


commands = [release, publish]
