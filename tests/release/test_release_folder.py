"""The release folder's last step: nothing this run did not make is removed, a folder that appears
while a release is built is left alone, and two releases to one folder never both succeed.

The window between the destination check and the final move is the body of `built_beside`: what a
test does there is what another process could do at that moment, so the races are tested directly;
the last test races two real command lines.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_gguf.errors import OutputError
from dflash_gguf.outputs import rename_exclusive
from dflash_gguf.owned_folder import MANIFEST, built_beside


def _hidden(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def _shown(folder: Path) -> list[str]:
    """What a folder holds, less the manifest every folder output carries."""
    return sorted(p.name for p in folder.iterdir() if p.name != MANIFEST)


def _build(out: Path, during=None, force: bool = False, files: dict[str, str] | None = None) -> None:
    """A release built for `out` (`files`, else one card); `during` runs between the check and the move."""
    with built_beside(out, force=force, command="release") as folder:
        for name, text in (files or {"README.md": "new card"}).items():
            (folder / name).write_text(text)
        if during is not None:
            during()


@pytest.mark.parametrize("there", ["empty folder", "folder", "file"])
def test_rename_exclusive_never_replaces_what_is_there(tmp_path: Path, there: str):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "a").write_text("new")
    if there == "file":
        dst.write_text("theirs")
    else:
        dst.mkdir()
        if there == "folder":
            (dst / "b").write_text("theirs")
    with pytest.raises(FileExistsError):
        rename_exclusive(src, dst)
    assert (src / "a").read_text() == "new"
    assert (dst.read_text() if there == "file" else sorted(os.listdir(dst))) == \
        {"file": "theirs", "folder": ["b"], "empty folder": []}[there]
    os.unlink(dst) if there == "file" else __import__("shutil").rmtree(dst)
    rename_exclusive(src, dst)
    assert (dst / "a").read_text() == "new" and not src.exists()


def test_a_new_release_appears_whole(tmp_path: Path):
    out = tmp_path / "rel"
    _build(out)
    assert sorted(os.listdir(out)) == [MANIFEST, "README.md"] and _hidden(tmp_path) == []


@pytest.mark.parametrize("theirs", [{"notes.txt": "mine"}, {}])
def test_a_folder_that_appears_meanwhile_is_left_alone(tmp_path: Path, theirs: dict):
    out = tmp_path / "rel"

    def appear():
        out.mkdir()
        for name, text in theirs.items():
            (out / name).write_text(text)

    with pytest.raises(OutputError, match="something was put there while the release ran"):
        _build(out, appear)
    assert {p.name: p.read_text() for p in out.iterdir()} == theirs
    assert _hidden(tmp_path) == []  # the partial folder and the lock file are gone


def test_an_empty_folder_filled_meanwhile_is_left_alone(tmp_path: Path):
    out = tmp_path / "rel"
    out.mkdir()
    with pytest.raises(OutputError, match="something was put there"):
        _build(out, lambda: (out / "notes.txt").write_text("mine"))
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and _hidden(tmp_path) == []
    out.joinpath("notes.txt").unlink()
    _build(out)  # an empty folder, as checked, is taken
    assert _shown(out) == ["README.md"] and (out / "README.md").read_text() == "new card"


def test_force_replaces_an_earlier_release_but_not_a_file_put_in_it_meanwhile(tmp_path: Path):
    out = tmp_path / "rel"
    _build(out, files={"README.md": "old card", "dflash-T-Q2_K.gguf": "old variant"})
    with pytest.raises(OutputError, match=r"holds notes.txt, which `dflash-gguf release` did not write"):
        _build(out, lambda: (out / "notes.txt").write_text("mine"), force=True)
    assert {n: (out / n).read_text() for n in _shown(out)} == {
        "README.md": "old card", "dflash-T-Q2_K.gguf": "old variant", "notes.txt": "mine"}
    assert _hidden(tmp_path) == []
    (out / "notes.txt").unlink()
    _build(out, force=True)
    assert _shown(out) == ["README.md"] and (out / "README.md").read_text() == "new card"
    assert _hidden(tmp_path) == []


def test_without_force_an_earlier_release_is_refused_before_the_build(tmp_path: Path):
    out = tmp_path / "rel"
    _build(out, files={"README.md": "old card"})
    with pytest.raises(OutputError, match="already holds an earlier `dflash-gguf release` output; pass --force"):
        _build(out)
    assert (out / "README.md").read_text() == "old card" and _hidden(tmp_path) == []


def test_a_second_release_to_the_same_folder_is_refused_while_the_first_runs(tmp_path: Path):
    out = tmp_path / "rel"
    with pytest.raises(OutputError, match=r"another `dflash-gguf release` is writing this folder "
                                          rf"\(.*\.rel\.lock exists, held by process {os.getpid()}\)"):
        _build(out, lambda: _build(out))
    assert not out.exists() and _hidden(tmp_path) == []
    _build(out)  # the lock went with the first
    assert out.is_dir()


def test_a_lock_left_by_a_process_that_ended_is_named_so(tmp_path: Path):
    out = tmp_path / "rel"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / ".rel.lock").write_text(dead.stdout)
    with pytest.raises(OutputError, match=f"left by process {dead.stdout.strip()}, which has ended.*remove"):
        _build(out)
    assert not out.exists() and _hidden(tmp_path) == [".rel.lock"]  # not ours: left for the user


def test_two_release_commands_on_one_folder_one_wins(drafter_copy, target_gguf, tmp_path: Path):
    drafter = drafter_copy("dflash-b16")
    card = drafter / "README.md"
    card.write_text("---\nlicense: mit\n---\n# drafter\n")
    out = tmp_path / "rel"
    args = [sys.executable, "-m", "dflash_gguf.cli", "release", str(drafter), "--target", str(target_gguf),
            "--types", "F16", "-o", str(out), "--target-license", "mit", "--skip-validate", "--name", "T"]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refusal = next(err for code, err in results if code == 2)
    assert refusal.startswith("error: ") and refusal.strip().count("\n") == 0, refusal
    assert any(words in refusal for words in ("is writing this folder", "something was put there")), refusal
    assert _shown(out) == ["README.md", "dflash-T-F16.gguf"]
    assert _hidden(tmp_path) == []
