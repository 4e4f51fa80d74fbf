"""Committed weights against tests/fixtures/WEIGHTS.json (training/weights_manifest.py,
docs/testing.md#committed-weights): every weights file recorded with its size and sha256, every
record on disk, the card figures recorded the cards' current ones, the total under the budget; a
fixture builder refuses a committed folder whose weights differ from the record.

Each check runs on the real tree, and on a scratch repository where one edit must make it fail."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from training import weights_manifest as wm


def unrecorded(current: dict, recorded: dict) -> list[str]:
    def facts(e: dict) -> tuple:
        return e.get("bytes"), e.get("sha256")
    return [f"{path}: {e['bytes']} bytes, sha256 {e['sha256'][:12]}… not as recorded"
            for path, e in current["files"].items() if facts(recorded["files"].get(path, {})) != facts(e)]


def missing(repo: Path, recorded: dict) -> list[str]:
    return [path for path in recorded["files"] if not (repo / path).is_file()]


def moved_figures(current: dict, recorded: dict) -> list[str]:
    return [f"{path}: card {e['figures']}, recorded {recorded['files'][path]['figures']}"
            for path, e in current["files"].items()
            if path in recorded["files"] and e["figures"] != recorded["files"][path]["figures"]]


def over_budget(current: dict, budget: int) -> list[str]:
    return [f"{current['total_bytes']:,} bytes committed, budget {budget:,}"] if current["total_bytes"] > budget else []


FIX = (f"a weights file or its card changed: run `{wm.REGENERATE}` once the change is meant "
       "(docs/testing.md#committed-weights)")


@pytest.fixture(scope="module")
def real() -> tuple[dict, dict]:
    return wm.build(REPO), wm.read(REPO)


def test_every_weights_file_is_recorded_with_its_size_and_sha256(real):
    assert unrecorded(*real) == [], FIX


def test_every_recorded_weights_file_exists():
    assert missing(REPO, wm.read(REPO)) == [], FIX


def test_the_recorded_figures_are_the_cards_current_ones(real):
    assert moved_figures(*real) == [], FIX


def test_the_committed_weights_stay_under_the_budget(real):
    current, recorded = real
    assert over_budget(current, wm.BUDGET_BYTES) == []
    assert recorded["total_bytes"] == sum(e["bytes"] for e in recorded["files"].values())


def test_the_testing_page_states_the_budget():
    section = (REPO / "docs" / "testing.md").read_text().split("## Committed weights", 1)[1].split("\n## ", 1)[0]
    assert f"{wm.BUDGET_BYTES / 1e6:g} MB" in section


# --- a scratch repository: each check fails on the edit it exists for -----------------------------

DRAFTER = "tests/fixtures/zoo/toy/dflash2"
TARGET = "tests/fixtures/trained/target"


def _folder(repo: Path, rel: str, architecture: str, weights: bytes, held_out: dict | None = None) -> None:
    folder = repo / rel
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    (folder / "model.safetensors").write_bytes(weights)
    if held_out is not None:
        (folder / "trained.json").write_text(json.dumps({"held_out": held_out}))


@pytest.fixture
def scratch(tmp_path) -> Path:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    _folder(tmp_path, DRAFTER, "DFlash2DraftModel", b"drafter" * 100, {"tau": 5.7, "acceptance_rate": 0.7})
    _folder(tmp_path, TARGET, "Qwen3ForCausalLM", b"target" * 100)
    wm.write(tmp_path)
    return tmp_path


def _retrain(repo: Path) -> None:
    (repo / DRAFTER / "model.safetensors").write_bytes(b"retrained" * 100)


def _add(repo: Path) -> None:
    _folder(repo, "tests/fixtures/zoo/new/dflash", "DFlashDraftModel", b"new", {"tau": 2.0, "acceptance_rate": 0.2})


def _remeasure(repo: Path) -> None:
    (repo / DRAFTER / "trained.json").write_text(json.dumps({"held_out": {"tau": 6.1, "acceptance_rate": 0.7}}))


def test_the_scratch_repository_passes_every_check(scratch):
    current, recorded = wm.build(scratch), wm.read(scratch)
    assert unrecorded(current, recorded) == missing(scratch, recorded) == moved_figures(current, recorded) == []
    assert recorded["files"][f"{TARGET}/model.safetensors"]["figures"] is None
    assert recorded["files"][f"{DRAFTER}/model.safetensors"]["figures"] == {
        "card": f"{DRAFTER}/trained.json", "tau": 5.7, "acceptance_rate": 0.7}


@pytest.mark.parametrize("edit", [_retrain, _add], ids=["changed", "added"])
def test_a_changed_or_added_weights_file_fails_until_the_manifest_is_written(scratch, edit):
    edit(scratch)
    assert len(unrecorded(wm.build(scratch), wm.read(scratch))) == 1
    wm.write(scratch)
    assert unrecorded(wm.build(scratch), wm.read(scratch)) == []


def test_a_recorded_file_that_is_gone_fails(scratch):
    (scratch / DRAFTER / "model.safetensors").unlink()
    assert missing(scratch, wm.read(scratch)) == [f"{DRAFTER}/model.safetensors"]


def test_figures_that_moved_on_the_card_fail(scratch):
    _remeasure(scratch)
    [moved] = moved_figures(wm.build(scratch), wm.read(scratch))
    assert moved.startswith(f"{DRAFTER}/model.safetensors: card {{") and "'tau': 6.1" in moved and "'tau': 5.7" in moved


def test_a_total_over_the_budget_fails(scratch):
    current = wm.build(scratch)
    assert over_budget(current, current["total_bytes"]) == []
    assert over_budget(current, current["total_bytes"] - 1) != []


def test_a_drafter_without_card_figures_is_refused_with_one_line(scratch, monkeypatch, capsys):
    (scratch / DRAFTER / "trained.json").unlink()
    monkeypatch.setattr(wm, "REPO", scratch)
    before = (scratch / wm.MANIFEST).read_bytes()
    assert wm.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{DRAFTER}/model.safetensors: a drafter without card figures" in err
    assert (scratch / wm.MANIFEST).read_bytes() == before


def test_a_fixture_builder_refuses_weights_that_differ_from_the_record(scratch):
    assert wm.verified(scratch / DRAFTER, scratch) == scratch / DRAFTER
    _retrain(scratch)
    with pytest.raises(wm.WeightsError) as refused:
        wm.verified(scratch / DRAFTER, scratch)
    assert str(refused.value) == (
        f"{DRAFTER}/model.safetensors differs from what is recorded in {wm.MANIFEST}: restore it "
        f"(`git checkout -- {DRAFTER}/model.safetensors`), or for a retrain whose card figures moved run "
        f"`{wm.REGENERATE}` and commit both")
    _add(scratch)
    with pytest.raises(wm.WeightsError, match=re.escape(f"tests/fixtures/zoo/new/dflash/model.safetensors is not in "
                                                        f"{wm.MANIFEST}: remove it, or to commit it")):
        wm.verified(scratch / "tests/fixtures/zoo/new/dflash", scratch)


def test_the_committed_fixture_folders_pass_the_builders_check():
    for folder in ("tests/fixtures/trained/target", "tests/fixtures/zoo/llama/dflash2",
                   "tests/fixtures/smollm2/dflash"):
        assert wm.verified(REPO / folder) == REPO / folder
