"""--force replaces a folder output only where the toolkit wrote every file in it, as the folder's
manifest (dflash_gguf/owned_folder.py) records them: a user's own files, whatever their names, a file
edited since, and a folder from before manifests are refused and left byte for byte; nothing is removed
through a link swapped in while a command runs; no signal leaves a `.old` or `.partial` folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dflash_gguf.errors import OutputError
from dflash_gguf.hashing import sha256_file
from dflash_gguf.owned_folder import MANIFEST, built_beside
from tests.conftest import REPO, dflash_gguf
from tests.refusal import assert_refused, snapshot


def _hidden(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def _write(out: Path, files: dict[str, str], force: bool = False, command: str = "release", during=None) -> None:
    """A folder output of `command` holding `files`, put at `out` as the commands do."""
    with built_beside(out, force=force, command=command) as tmp:
        for name, text in files.items():
            (tmp / name).write_text(text)
        if during is not None:
            during()


@pytest.fixture
def mit_drafter(drafter_copy) -> Path:
    drafter = drafter_copy("dflash-b16")
    (drafter / "README.md").write_text("---\nlicense: mit\n---\n# drafter\n")
    return drafter


def _release(drafter: Path, target: Path, out: Path, *extra: str):
    return dflash_gguf("release", drafter, "--target", target, "--types", "F16", "-o", out, "--target-license", "mit",
                       "--skip-validate", "--name", "T", *extra)


# -- release, the real command --------------------------------------------------------------------

@pytest.mark.parametrize("theirs", [
    {"README.md": "# my notes\n", "LICENSE": "my own license\n"},
    {"dflash-my-experiment.gguf": "GGUF of my own\n"},
])
def test_release_force_never_removes_a_users_files_named_like_release_files(mit_drafter, target_gguf, tmp_path,
                                                                           theirs):
    out = tmp_path / "rel"
    out.mkdir()
    for name, text in theirs.items():
        (out / name).write_text(text)
    kept = snapshot(out)
    line = assert_refused(_release(mit_drafter, target_gguf, out, "--force"), *theirs,
                          "`dflash-gguf release` did not write", f"no {MANIFEST}", "remove the folder yourself")
    assert "nothing was removed" in line
    assert snapshot(out) == kept and sorted(os.listdir(out)) == sorted(theirs)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_release_force_replaces_the_folder_an_earlier_release_wrote(mit_drafter, target_gguf, tmp_path):
    out = tmp_path / "rel"
    first = _release(mit_drafter, target_gguf, out)
    assert first.returncode == 0, first.stderr
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["command"] == "release"
    assert manifest["files"] == {n: {"bytes": (out / n).stat().st_size, "sha256": sha256_file(out / n)}
                                 for n in ("README.md", "dflash-T-F16.gguf")}
    assert_refused(_release(mit_drafter, target_gguf, out), "already holds an earlier `dflash-gguf release` output",
                   "--force")
    again = _release(mit_drafter, target_gguf, out, "--force", "--types", "F16,BF16")
    assert again.returncode == 0, again.stderr
    assert sorted(os.listdir(out)) == [MANIFEST, "README.md", "dflash-T-BF16.gguf", "dflash-T-F16.gguf"]
    assert sorted(json.loads((out / MANIFEST).read_text())["files"]) == ["README.md", "dflash-T-BF16.gguf",
                                                                       "dflash-T-F16.gguf"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_release_force_refuses_a_file_edited_since_it_was_written(mit_drafter, target_gguf, tmp_path):
    out = tmp_path / "rel"
    assert _release(mit_drafter, target_gguf, out).returncode == 0
    with (out / "README.md").open("a") as card:
        card.write("\nMy own notes on this release.\n")
    kept = snapshot(out)
    assert_refused(_release(mit_drafter, target_gguf, out, "--force"), "README.md (changed since it was written)",
                   "did not write", "move them out")
    assert snapshot(out) == kept


# -- the folder mechanism, in the window a command leaves open -----------------------------------

def test_an_earlier_output_swapped_for_a_link_while_a_command_runs_is_not_followed(tmp_path):
    out, elsewhere = tmp_path / "rel", tmp_path / "elsewhere"
    _write(out, {"README.md": "old card", "dflash-T-Q2_K.gguf": "old variant"})
    theirs = snapshot(out)

    def swap():  # the earlier release, manifest and all, moved; a link to it left in its place
        out.rename(elsewhere)
        out.symlink_to(elsewhere, target_is_directory=True)

    with pytest.raises(OutputError, match="became a link.*nothing in it removed"):
        _write(out, {"README.md": "new card"}, force=True, during=swap)
    assert out.is_symlink() and os.readlink(out) == str(elsewhere)
    assert snapshot(elsewhere) == {elsewhere / p.name: d for p, d in theirs.items()}
    assert _hidden(tmp_path) == []  # no .rel.*.old, .rel.*.partial or lock left


def test_a_link_given_as_the_output_is_refused_before_anything(tmp_path):
    elsewhere, out = tmp_path / "elsewhere", tmp_path / "rel"
    _write(elsewhere, {"README.md": "card"})
    out.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(OutputError, match="is a link; nothing is written or removed through a link"):
        _write(out, {"README.md": "new"}, force=True)
    assert (elsewhere / "README.md").read_text() == "card" and out.is_symlink()


def test_an_output_of_another_command_is_not_replaced(tmp_path):
    out = tmp_path / "drafter"
    _write(out, {"config.json": "{}", "README.md": "card"}, command="train")
    with pytest.raises(OutputError, match="records the output of `dflash-gguf train`, not of `release`"):
        _write(out, {"README.md": "new"}, force=True)
    assert (out / "README.md").read_text() == "card"


_SIGNALLED = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from dflash_gguf.owned_folder import built_beside
    from dflash_gguf.signals import raise_on_terminate

    out, call = Path(sys.argv[1]), sys.argv[2]

    def write(text, force):
        with built_beside(out, force=force, command="release") as tmp:
            (tmp / "README.md").write_text(text)

    def profile(frame, event, arg):  # SIGTERM the moment the first os.<call> of the replacement returns
        if event == "c_return" and getattr(arg, "__name__", "") == call and getattr(arg, "__module__", "") == "posix":
            sys.setprofile(None)
            os.kill(os.getpid(), signal.SIGTERM)

    write("old card", False)
    try:
        with raise_on_terminate():
            sys.setprofile(profile)
            write("new card", True)
    except KeyboardInterrupt:
        sys.exit(128 + signal.SIGTERM)
    """)


@pytest.mark.parametrize("call, left", [("rename", "old card"), ("unlink", "new card")])
def test_sigterm_while_an_earlier_output_is_set_aside_or_removed_leaves_one_whole_folder(tmp_path, call, left):
    """SIGTERM just after the earlier output is renamed aside ("rename") or just after its first file is
    removed ("unlink"): the command ends with 143 and leaves one whole folder, never a `.old` one."""
    out = tmp_path / "rel"
    proc = subprocess.run([sys.executable, "-c", _SIGNALLED, str(out), call], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert sorted(os.listdir(out)) == [MANIFEST, "README.md"] and (out / "README.md").read_text() == left
    assert _hidden(tmp_path) == []


# -- train: the same rule through its command line -------------------------------------------------

def _train(target: Path, prompts: Path, out: Path, *extra: str):
    return dflash_gguf("train", "--target", target, "--prompts", prompts, "-o", out, "--threads", "1", *extra)


@pytest.mark.parametrize("theirs", [
    {"README.md": "<!-- written by dflash-gguf train -->\nan older train's card\n", "config.json": "{}\n",
     "model.safetensors": "weights\n"},  # what a train before manifests wrote: no record of it
    {"README.md": "# my notes\n", "LICENSE": "mine\n"},
])
def test_train_force_never_removes_files_it_did_not_record(target_gguf, tmp_path, theirs):
    pytest.importorskip("torch")
    pytest.importorskip("dflash.model")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n")  # refused once the output is checked: nothing is trained either way
    out = tmp_path / "out"
    out.mkdir()
    for name, text in theirs.items():
        (out / name).write_text(text)
    kept = snapshot(out)
    assert_refused(_train(target_gguf, prompts, out, "--force"), str(out), "`dflash-gguf train` did not write",
                   f"no {MANIFEST}")
    assert snapshot(out) == kept and sorted(os.listdir(out)) == sorted(theirs)


def test_train_force_takes_a_folder_an_earlier_train_wrote(target_gguf, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("dflash.model")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n")
    out = tmp_path / "out"
    _write(out, {"config.json": "{}\n", "model.safetensors": "weights\n", "README.md": "card\n"}, command="train")
    assert_refused(_train(target_gguf, prompts, out), "already holds an earlier `dflash-gguf train` output", "--force")
    (out / "notes.txt").write_text("mine\n")
    assert_refused(_train(target_gguf, prompts, out, "--force"), "holds notes.txt, which `dflash-gguf train` did "
                   "not write", "move them out")
    (out / "notes.txt").unlink()
    assert_refused(_train(target_gguf, prompts, out, "--force"), "prompts.txt", "no prompts")  # past the folder check
    assert sorted(os.listdir(out)) == [MANIFEST, "README.md", "config.json", "model.safetensors"]
