"""No command writes over its own inputs, --force or not, and reports and logs never replace a file
that is not theirs (issue 14, class 1). Every case runs the real command line and checks the input's
bytes afterwards."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from dflash_gguf.errors import DflashError
from dflash_gguf.outputs import Input, Output, Replace, check_outputs
from tests.conftest import cli
from tests.refusal import assert_refused
from tests.legacy_fixture import make_legacy


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def target(target_gguf: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "target.gguf"
    shutil.copyfile(target_gguf, copy)
    return copy


@pytest.fixture
def drafter(converted: dict[str, Path], tmp_path: Path) -> Path:
    copy = tmp_path / "dflash.gguf"
    shutil.copyfile(converted["dflash-b16"], copy)
    return copy


# -- convert -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["same-path", "symlink", "hard-link", "dotted-path"])
def test_convert_never_replaces_its_target(drafter_copy, target, tmp_path, how):
    ckpt = drafter_copy("dflash-b16")
    before = _digest(target)
    out = {"same-path": lambda: target,
           "symlink": lambda: (tmp_path / "link.gguf").symlink_to(target) or tmp_path / "link.gguf",
           "hard-link": lambda: os.link(target, tmp_path / "hard.gguf") or tmp_path / "hard.gguf",
           "dotted-path": lambda: tmp_path / "." / "x" / ".." / "target.gguf"}[how]()
    if how == "dotted-path":
        (tmp_path / "x").mkdir()
    assert_refused(cli("convert", ckpt, "--target", target, "-o", out, "--force"), "--target", "never replaces")
    assert _digest(target) == before
    assert not list(tmp_path.glob(".*.partial"))


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "README.md"])
def test_convert_never_replaces_a_checkpoint_file(drafter_copy, target, name):
    ckpt = drafter_copy("dflash-b16")
    victim = ckpt / name
    if not victim.exists():
        victim.write_text("---\nlicense: mit\n---\n")
    before = _digest(victim)
    assert_refused(cli("convert", ckpt, "--target", target, "-o", victim, "--force"), "SRC", str(ckpt))
    assert _digest(victim) == before


def test_convert_into_the_checkpoint_folder_is_fine_for_a_new_gguf(drafter_copy, target):
    ckpt = drafter_copy("dflash-b16")
    out = ckpt / "dflash.gguf"
    assert cli("convert", ckpt, "--target", target, "-o", out).returncode == 0
    # a GGUF in the folder is no input of the checkpoint reader: --force may replace it
    proc = cli("convert", ckpt, "--target", target, "-o", out, "--force")
    assert proc.returncode == 0, proc.stderr


def test_legacy_default_output_is_never_the_input(converted, tmp_path):
    legacy = make_legacy(converted["dflash-b16"], tmp_path / "old.gguf")
    before = _digest(legacy)
    proc = cli("convert", "old.gguf", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "old-migrated.gguf").is_file()
    assert _digest(legacy) == before
    assert_refused(cli("convert", "old.gguf", "-o", "old.gguf", "--force", cwd=tmp_path), "SRC", "never replaces")
    assert _digest(legacy) == before


def test_convert_to_a_folder_says_it_is_a_folder(drafter_copy, target, tmp_path):
    (tmp_path / "outdir").mkdir()
    assert_refused(cli("convert", drafter_copy("dflash-b16"), "--target", target, "-o", tmp_path / "outdir"),
             "is a folder", "give a file name")


def test_convert_to_a_fifo_is_refused(drafter_copy, target, tmp_path):
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    assert_refused(cli("convert", drafter_copy("dflash-b16"), "--target", target, "-o", fifo, "--force"),
             "not a regular file")


# -- quantize and release --------------------------------------------------------------------------------

def test_quantize_never_replaces_its_input(drafter, tmp_path):
    before = _digest(drafter)
    assert_refused(cli("quantize", drafter, drafter, "--type", "Q8_0", "--force"), "IN.gguf", "never replaces")
    os.link(drafter, tmp_path / "same.gguf")
    assert_refused(cli("quantize", drafter, tmp_path / "same.gguf", "--type", "Q8_0", "--force"), "never replaces")
    assert _digest(drafter) == before


@pytest.mark.parametrize("where", ["draft-dir", "parent"])
def test_release_folder_never_replaces_or_holds_an_input(drafter_copy, target, where):
    ckpt = drafter_copy("dflash-b16")
    (ckpt / "README.md").write_text("---\nlicense: apache-2.0\n---\n")
    before = {p.name: _digest(p) for p in ckpt.iterdir()}
    out = ckpt if where == "draft-dir" else ckpt.parent
    assert_refused(cli("release", ckpt, "--target", target, "--types", "F16", "-o", out, "--force",
                         "--skip-validate", "--target-license", "apache-2.0"), "DRAFT_DIR")
    assert {p.name: _digest(p) for p in ckpt.iterdir()} == before


# -- reports and logs --------------------------------------------------------------------------------------

def test_validate_report_never_replaces_an_input_or_a_foreign_file(target, drafter, tmp_path):
    before = _digest(target)
    assert_refused(cli("validate", "--target", target, "--draft", drafter, "--report", target), "--report",
             "never replaces")
    assert _digest(target) == before
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    assert_refused(cli("validate", "--target", target, "--draft", drafter, "--report", notes),
             "not a report this command wrote")
    assert notes.read_text() == "my notes\n"


def test_validate_report_may_replace_its_own_earlier_report(target, drafter, tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"prompts": [], "mean_acceptance_length": 1.0, "divergences": []}))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    # the report passes the output check; the empty prompts file is what stops the run, before any server
    assert_refused(cli("validate", "--target", target, "--draft", drafter, "--report", report, "--prompts", empty),
             "no prompts")


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_log_never_replaces_the_drafter_or_a_foreign_file(target, drafter, tmp_path, command):
    before = _digest(drafter)
    args = ["--target", target, "--draft", drafter] + (["hello"] if command == "generate" else [])
    assert_refused(cli(command, *args, "--log", drafter), "--log", "never replaces")
    assert _digest(drafter) == before
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    assert_refused(cli(command, *args, "--log", notes), "not a llama-server log")
    assert notes.read_text() == "my notes\n"


# -- the rules themselves ----------------------------------------------------------------------------------

def test_owned_outputs_and_distinct_outputs(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text("{}")
    check_outputs([Output(a, "--json", Replace.OWNED, owned=lambda p: True)], [])
    with pytest.raises(DflashError, match="not a report"):
        check_outputs([Output(a, "--json", Replace.OWNED, owned=lambda p: False, what="report")], [])
    b.write_text("")  # an empty file has nothing to lose
    check_outputs([Output(b, "--json", Replace.OWNED, owned=lambda p: False)], [])
    with pytest.raises(DflashError, match="give each output its own name"):
        check_outputs([Output(tmp_path / "c", "-o"), Output(tmp_path / "c", "--json")], [])
    with pytest.raises(DflashError, match="does not exist"):
        check_outputs([Output(tmp_path / "nowhere" / "c", "-o")], [Input(a, "SRC")])


def test_hub_cache_blob_behind_a_snapshot_link_is_protected(tmp_path):
    blob = tmp_path / "models--o--n" / "blobs" / "abc"
    snap = tmp_path / "models--o--n" / "snapshots" / "rev"
    blob.parent.mkdir(parents=True)
    snap.mkdir(parents=True)
    blob.write_bytes(b"weights")
    (snap / "model.safetensors").symlink_to(blob)
    with pytest.raises(DflashError, match="never replaces"):
        check_outputs([Output(blob, "-o")], [Input(snap, "SRC")], force=True)


def test_is_report_reads_only_a_regular_file(tmp_path):
    """validate's --report check opens nothing that could block or stream forever (a FIFO)."""
    from dflash_gguf.validation.validate import REPORT_KEYS, REPORT_KINDS, is_report

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert not is_report(fifo)  # returns at once: no writer ever opens the FIFO
    report = tmp_path / "r.json"
    report.write_text(json.dumps({**{k: 1 for k in REPORT_KEYS}, sorted(REPORT_KINDS)[0]: 1}))
    assert is_report(report)
    report.write_text("{}")
    assert not is_report(report)
