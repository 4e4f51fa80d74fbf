"""`dflash-gguf tune` and the tuned setting `serve` uses: the grid, the choice, the stored record and
how serve merges it with the user's own arguments (unit, on real files); then a real tune and a real
serve on the trained pair and on a random-weight drafter that cannot pay (integration)."""

from __future__ import annotations

import json
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflash_gguf.errors import InputError
from dflash_gguf.convert.converter import convert
from dflash_gguf.runner import tuned_settings as tuned
from dflash_gguf.runner.client import LlamaClient
from dflash_gguf.runner.launch import launch_recipe, read_draft
from dflash_gguf.runner.tune import (
    Candidate,
    Setting,
    best_drafting,
    controller_settings,
    draft_grid,
    faster_alone,
    drafting_pays,
    midpoints,
    thread_grid,
    with_controller,
)
from dflash_gguf.runner.build import build_info
from tests.conftest import REPO, dflash_gguf
from tests.refusal import assert_refused

# ---------------------------------------------------------------------------------------------
# The grid and the choice
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cpus, grid", [(1, [1]), (2, [1, 2]), (4, [1, 2, 3, 4]), (12, [1, 2, 4, 8, 12]),
                                        (16, [1, 2, 4, 8, 16])])
def test_thread_grid_spans_one_to_every_cpu(cpus, grid):
    assert thread_grid(cpus) == grid


@pytest.mark.parametrize("longest, grid", [(1, [1]), (7, [1, 2, 4, 7]), (8, [1, 2, 4, 8]), (15, [1, 2, 4, 8, 15])])
def test_draft_grid_is_powers_of_two_up_to_the_trained_length(longest, grid):
    assert draft_grid(longest) == grid


@pytest.mark.parametrize("measured, best, more", [
    ([1, 2, 4, 8, 15], 8, [6, 11]),
    ([1, 2, 4, 8, 15], 15, [11]),
    ([1, 2, 4, 6, 8, 11, 15], 6, [5, 7]),
    ([1, 2, 4, 5, 6, 7, 8], 6, []),     # both neighbours next to it: nothing left between
    ([1, 2], 1, []),
])
def test_midpoints_refine_around_the_best_length(measured, best, more):
    assert midpoints(measured, best) == more


def _candidate(setting: Setting, ratios: list[float], error: str | None = None) -> Candidate:
    return Candidate(setting, ratios=list(ratios), tokens_per_second=[100.0] * len(ratios), error=error)


def test_the_best_drafting_setting_is_the_highest_median_ratio_among_those_that_ran():
    alone = _candidate(Setting(False, 1), [3.0, 3.0, 3.0])              # never a drafting choice
    broken = _candidate(Setting(True, 1, 2), [], error="did not start")
    steady = _candidate(Setting(True, 1, 4), [1.10, 1.12, 1.11])
    lucky = _candidate(Setting(True, 1, 8), [0.70, 0.80, 2.50])           # one outlier: median 0.80
    assert best_drafting([alone, broken, steady, lucky]) is steady
    assert best_drafting([alone, broken]) is None
    cut_short = _candidate(Setting(True, 2, 4), [1.5])                    # stopped after one pair
    cut_short.abandoned = True
    assert best_drafting([lucky, cut_short]) is lucky
    assert best_drafting([alone, cut_short]) is cut_short
    stalled = _candidate(Setting(True, 2, 2), [2.0, 2.0, 2.0, 2.0])      # fast, but one request hung
    stalled.stalled = stalled.abandoned = True
    assert best_drafting([stalled, cut_short]) is cut_short


def test_the_reference_moves_only_to_a_thread_count_measured_faster_without_a_hang():
    slower = _candidate(Setting(False, 2), [0.5, 0.6, 0.7])
    faster = _candidate(Setting(False, 4), [1.2, 1.3, 1.25])
    fastest_but_hung = _candidate(Setting(False, 8), [2.0, 2.0, 2.0])
    fastest_but_hung.stalled = True
    drafting = _candidate(Setting(True, 8, 4), [3.0, 3.0, 3.0])
    assert faster_alone([slower, faster, fastest_but_hung, drafting]) is faster
    assert faster_alone([slower, fastest_but_hung]) is None


def test_drafting_pays_only_from_the_minimum_speedup():
    assert drafting_pays(1.05, 1.05) and drafting_pays(2.0, 1.05)
    assert not drafting_pays(1.049, 1.05) and not drafting_pays(None, 1.05) and not drafting_pays(0.8, 1.0)


def test_candidate_speedup_is_the_median_of_request_pairs_and_tau_counts_steps():
    c = Candidate(Setting(True, 1, 4), ratios=[0.9, 1.2, 5.0, 1.1, 1.0], produced=100, accepted=60, requests=4)
    assert c.speedup == 1.1
    assert c.spread == (0.95, 3.1)
    # 96 tokens from steps (4 came from prefills), 60 of them accepted drafts: 36 steps
    assert c.tau == pytest.approx(96 / 36)
    assert Candidate(Setting(False, 1), produced=100).tau is None


def test_setting_flags_and_record_round_trip():
    s = Setting(True, threads=2, draft_max=4, p_min=0.25)
    assert s.server_args() == ["-t", "2", "--spec-draft-p-min", "0.25"]
    assert Setting(False, threads=2, p_min=0.25).server_args() == ["-t", "2"]  # p_min is a drafting flag
    assert Setting(True, draft_max=4).server_args() == []
    assert Setting.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert s.label() == "drafter -t 2 n_max 4 p_min 0.25" and Setting(False).label() == "target alone"


def test_a_tree_is_a_drafting_flag_and_its_budget_is_read_back_in_range():
    tree = Setting(True, threads=1, draft_max=7, tree_budget=16)
    assert tree.server_args() == ["-t", "1", "--spec-tree-budget", "16"] and tree.label() == "drafter -t 1 n_max 7 tree 16"
    assert Setting(False, threads=1, tree_budget=16).server_args() == ["-t", "1"]
    assert Setting.from_dict(json.loads(json.dumps(tree.to_dict()))) == tree
    with pytest.raises(InputError, match="chosen.tree_budget"):
        Setting.from_dict({**tree.to_dict(), "tree_budget": 4096})
    floor = Setting(True, threads=1, draft_max=7, tree_budget=16, tree_p_min=0.2)
    assert floor.server_args() == ["-t", "1", "--spec-tree-budget", "16", "--spec-tree-p-min", "0.2"]
    assert floor.label() == "drafter -t 1 n_max 7 tree 16 floor 0.2"
    assert Setting.from_dict(json.loads(json.dumps(floor.to_dict()))) == floor
    for bad in (1, -0.1, "0.2"):  # llama-server refuses a floor of 1; a record is untrusted
        with pytest.raises(InputError, match="chosen.tree_p_min"):
            Setting.from_dict({**floor.to_dict(), "tree_p_min": bad})
    # a floor without a tree is no flag (llama-server would refuse it)
    assert Setting(True, threads=1, tree_p_min=0.2).server_args() == ["-t", "1"]


def test_the_controller_is_a_setting_of_its_own_and_is_served_within_three_percent_of_the_best():
    auto = Setting(True, threads=1, draft_max="auto")
    assert auto.label() == "drafter -t 1 n_max auto" and Setting.from_dict(auto.to_dict()) == auto
    static = Candidate(Setting(True, 1, 4), ratios=[1.30, 1.30, 1.30])
    close = Candidate(auto, ratios=[1.27, 1.27, 1.27])
    assert with_controller(static, [static, close]) is close  # 1.27 >= 0.97 * 1.30
    far = Candidate(auto, ratios=[1.20, 1.20, 1.20])
    assert with_controller(static, [static, far]) is static
    stopped = Candidate(auto, ratios=[1.40], abandoned=True)
    assert with_controller(static, [static, stopped]) is static


def test_the_controller_is_measured_again_at_the_best_chains_p_min_and_the_faster_is_served():
    auto = Setting(True, threads=1, draft_max="auto")
    chain = Candidate(Setting(True, 1, 7, 0.8), ratios=[1.90, 1.90, 1.90])
    assert controller_settings(chain, auto) == [auto, Setting(True, 1, "auto", 0.8)]
    assert Setting(True, 1, "auto", 0.8).server_args() == ["-t", "1", "--spec-draft-p-min", "0.8"]
    # no p_min on the best chain (or none measured, or a tree's): the controller alone
    assert controller_settings(Candidate(Setting(True, 1, 7), ratios=[1.5]), auto) == [auto]
    assert controller_settings(None, auto) == [auto]
    tree = Candidate(Setting(True, 1, 7, 0.8, tree_budget=16), ratios=[2.0])
    assert controller_settings(tree, auto) == [auto]
    # the faster of the two is the controller compared with the best static setting
    plain, confident = Candidate(auto, ratios=[1.81] * 3), Candidate(Setting(True, 1, "auto", 0.8), ratios=[2.19] * 3)
    assert with_controller(chain, [chain, plain, confident]) is confident
    assert with_controller(chain, [chain, plain]) is chain  # 1.81 < 0.97 * 1.90


def test_draft_max_auto_reaches_llama_server_and_reports(tiny_pair):
    target, draft = tiny_pair
    for launch in (launch_recipe(target, draft, draft_max="auto"),
                   launch_recipe(target, draft, server_args=["--spec-draft-n-max", "AUTO"])):
        args = launch.args()
        assert args[args.index("--spec-draft-n-max") + 1] == "auto"
        assert launch.auto and launch.draft_setting == "auto" and launch.draft_length == 7
    assert not launch_recipe(target, draft, draft_max=3).auto


# ---------------------------------------------------------------------------------------------
# The record: identity, key, storage
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def tuned_home(tmp_path: Path, monkeypatch) -> Path:
    home = tmp_path / "tuned"
    monkeypatch.setenv("DFLASH_GGUF_TUNED", str(home))
    return home


def _write(path: Path, size: int, seed: int = 0) -> Path:
    path.write_bytes(bytes((i * 7 + seed) % 251 for i in range(size)))
    return path


def test_a_file_is_known_by_its_bytes_not_its_path(tmp_path: Path):
    big = _write(tmp_path / "target.gguf", 3 * (1 << 20) + 123)
    copy = tmp_path / "elsewhere" / "renamed.gguf"
    copy.parent.mkdir()
    shutil.copy(big, copy)
    assert tuned.file_identity(copy) == tuned.file_identity(big)
    for offset in (10, big.stat().st_size // 2, big.stat().st_size - 5):  # header, middle, tail
        changed = bytearray(big.read_bytes())
        changed[offset] ^= 1
        other = tmp_path / f"changed-{offset}.gguf"
        other.write_bytes(bytes(changed))
        assert tuned.file_identity(other) != tuned.file_identity(big), offset
    small = _write(tmp_path / "small.gguf", 100)
    grown = _write(tmp_path / "grown.gguf", 101)
    assert tuned.file_identity(small) != tuned.file_identity(grown)


def _record(chosen: Setting, pays: bool, speedup: float = 1.3) -> dict:
    return {"chosen": chosen.to_dict(), "chosen_label": chosen.label(), "drafting_pays": pays, "speedup": speedup,
            "best_drafting": {"label": "drafter -t 1 n_max 4", "tau": 3.2, "pairs": 18},
            "settings": {"min_speedup": 1.05}, "finished_at": "2026-12-01T00:00:00Z"}


def test_saved_per_target_drafter_and_build_whole_or_not_at_all(tmp_path: Path, tuned_home: Path):
    target, draft = _write(tmp_path / "t.gguf", 5000), _write(tmp_path / "d.gguf", 3000, seed=1)
    key = tuned.TuneKey.of(target, draft, "71e8d1dc00673b20")
    assert tuned.load(key) is None
    path = tuned.save(key, _record(Setting(True, 1, 4), True))
    assert path.parent == tuned_home and sorted(p.name for p in tuned_home.iterdir()) == [path.name]
    assert tuned.load(key)["chosen"] == Setting(True, 1, 4).to_dict()
    assert tuned.load(tuned.TuneKey.of(target, draft, "6a1ab817b7daca0a")) is None   # another build
    assert tuned.load(tuned.TuneKey.of(draft, target, "71e8d1dc00673b20")) is None   # the pair swapped
    assert tuned.load(tuned.TuneKey.of(target, draft, "71e8d1dc00673b20", exact=True)) is None  # --exact
    exact = tuned.save(tuned.TuneKey.of(target, draft, "71e8d1dc00673b20", exact=True), _record(Setting(False, 2), False))
    assert exact != path and tuned.load(key)["chosen"] == Setting(True, 1, 4).to_dict()
    exact.unlink()
    with pytest.raises(TypeError):  # a result that cannot be written leaves the saved one as it was
        tuned.save(key, {**_record(Setting(False, 2), False), "bad": object()})
    assert tuned.load(key)["chosen"] == Setting(True, 1, 4).to_dict()
    assert sorted(p.name for p in tuned_home.iterdir()) == [path.name]


def test_a_damaged_or_foreign_record_is_refused_with_its_file_named(tmp_path: Path, tuned_home: Path):
    target, draft = _write(tmp_path / "t.gguf", 5000), _write(tmp_path / "d.gguf", 3000, seed=1)
    key = tuned.TuneKey.of(target, draft, "b")
    path = tuned.save(key, _record(Setting(True, 1, 4), True))
    path.write_text(path.read_text()[:40])
    with pytest.raises(tuned.UnreadableTuning, match=re.escape(str(path))):
        tuned.load(key)
    other = tuned.save(tuned.TuneKey.of(target, draft, "c"), _record(Setting(True, 1, 4), True))
    shutil.copy(other, path)  # another build's record under this key's name
    with pytest.raises(tuned.UnreadableTuning, match="field 'key'"):
        tuned.load(key)


# ---------------------------------------------------------------------------------------------
# serve: the tuned setting under the user's own choices, on a real launch of a real drafter
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_pair(fixtures: Path, target_gguf: Path, tmp_path_factory) -> tuple[Path, Path]:
    """The tiny random target and a random-weight DFlash 2 drafter (block 8: drafts of up to 7)."""
    out = tmp_path_factory.mktemp("tune") / "dflash2-b8.gguf"
    convert(fixtures / "dflash2-b8", target_gguf, out, "f16")
    return target_gguf, out


def _launch(target: Path, draft: Path, record: dict, draft_max: int | None = None, args: tuple[str, ...] = ()):
    applied = tuned.apply(record, draft_max, args)
    launch = launch_recipe(target, draft if applied.drafting else None, draft_max=applied.draft_max,
                           server_args=applied.server_args, check=False)
    return applied, launch


def test_serve_takes_a_tuned_tree_unless_the_user_chose_the_controller_or_a_budget(tiny_pair):
    target, draft = tiny_pair
    record = _record(Setting(True, 1, 7, tree_budget=8), True)
    applied, launch = _launch(target, draft, record)
    assert launch.tree_budget == 8 and "--spec-tree-budget 8" in " ".join(applied.taken)
    assert launch.args()[launch.args().index("--spec-tree-budget") + 1] == "8"
    applied, launch = _launch(target, draft, record, args=("--spec-tree-budget", "32"))
    assert launch.tree_budget == 32 and "--spec-tree-budget" not in " ".join(applied.taken)
    applied, launch = _launch(target, draft, record, draft_max="auto")
    assert launch.tree_budget == 0 and launch.auto
    # a tuned floor comes with its tree, unless the user gave their own
    record = _record(Setting(True, 1, 7, tree_budget=8, tree_p_min=0.1), True)
    applied, launch = _launch(target, draft, record)
    assert "--spec-tree-budget 8 --spec-tree-p-min 0.1" in " ".join(applied.taken), applied.taken
    assert launch.tree_p_min == 0.1 and launch.args()[launch.args().index("--spec-tree-p-min") + 1] == "0.1"
    applied, launch = _launch(target, draft, record, args=("--spec-tree-p-min", "0.3"))
    assert "--spec-tree-p-min" not in applied.taken and launch.tree_p_min == 0.3
    assert "--spec-tree-p-min" not in launch.alone().args()  # llama-server refuses a floor without a tree


def test_serve_takes_every_tuned_flag_the_user_left_open(tiny_pair):
    target, draft = tiny_pair
    applied, launch = _launch(target, draft, _record(Setting(True, 1, 3, 0.4), True))
    assert applied.drafting and launch.draft_length == 3
    assert launch.args()[:6] == ["-md", str(draft), "--spec-type", "draft-dflash", "--spec-draft-n-max", "3"]
    assert launch.user_args == ("-t", "1", "--spec-draft-p-min", "0.4")
    assert applied.taken == ("-t", "1", "--spec-draft-p-min", "0.4", "--spec-draft-n-max", "3")


@pytest.mark.parametrize("draft_max, args, length, user_args", [
    (5, (), 5, ("-t", "1", "--spec-draft-p-min", "0.4")),
    (None, ("--spec-draft-n-max", "2"), 2, ("-t", "1", "--spec-draft-p-min", "0.4")),
    (None, ("-t", "2"), 3, ("--spec-draft-p-min", "0.4", "-t", "2")),
    (None, ("--threads=2", "--draft-p-min", "0"), 3, ("--threads=2", "--draft-p-min", "0")),
    (None, ("-c", "256"), 3, ("-t", "1", "--spec-draft-p-min", "0.4", "-c", "256")),
])
def test_the_users_own_arguments_win_over_the_tuned_ones(tiny_pair, draft_max, args, length, user_args):
    target, draft = tiny_pair
    _, launch = _launch(target, draft, _record(Setting(True, 1, 3, 0.4), True), draft_max, args)
    assert launch.draft_length == length
    assert launch.user_args == user_args


def test_when_drafting_does_not_pay_serve_runs_the_target_alone_at_the_tuned_threads(tiny_pair):
    target, draft = tiny_pair
    applied, launch = _launch(target, draft, _record(Setting(False, 2), False, speedup=0.7),
                              args=("--spec-draft-n-max", "4"))
    assert not applied.drafting and launch.draft is None
    assert "-md" not in launch.args() and "--spec-type" not in launch.args()
    assert launch.user_args == ("-t", "2")


# ---------------------------------------------------------------------------------------------
# integration: the real patched llama-server
# ---------------------------------------------------------------------------------------------

def _tune(target: Path, draft: Path, llama_bin: Path, *extra: str) -> dict:
    proc = dflash_gguf("tune", "-t", target, "-d", draft, "--quick", "--json", "--llama-bin", llama_bin, *extra,
                       cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _serve(target: Path, draft: Path, llama_bin: Path, log: Path, *extra: str):
    """Start `serve`, ask one prompt, stop it: (the answer, serve's stderr, the server's log)."""
    proc = subprocess.Popen([sys.executable, "-m", "dflash_gguf.cli", "serve", "-t", str(target), "-d", str(draft),
                             "--llama-bin", str(llama_bin), "--log", str(log), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 0.2)[0]:
                break
        url = proc.stdout.readline().strip()
        assert url.startswith("http://"), proc.stderr.read() if proc.poll() is not None else url
        answer = LlamaClient(url).complete("The capital of France is", n_predict=24)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        return answer, proc.stderr.read(), log.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.integration
def test_quick_tune_on_the_trained_pair_is_saved_and_serve_runs_it(trained_pair: dict[str, Path], llama_bin: Path,
                                                                     tmp_path: Path, tuned_home: Path):
    target, draft = trained_pair["target"], trained_pair["dflash2"]
    result = _tune(target, draft, llama_bin, "--prompts", trained_pair["prompts"], "--", "-t", "1")

    # the search: every coarse draft length up to the drafter's trained one, then p_min, then a fresh confirmation
    longest = read_draft(draft).draft_length
    assert result["settings"]["draft_length"] == longest == 7
    lengths = {c["setting"]["draft_max"] for c in result["candidates"] if c["setting"]["drafting"]}
    assert lengths == {*draft_grid(longest), "auto"}  # the static lengths, and the controller beside them
    # the controller, and again at the p_min of the best chain before it where that chain has one
    controllers = [c for c in result["candidates"] if c["setting"]["draft_max"] == "auto"]
    assert all(c["stages"] == ["controller"] and c["error"] is None for c in controllers)
    assert [c["setting"]["p_min"] for c in controllers] in ([None], [None, 0.5])
    assert any(c["setting"]["p_min"] == 0.5 for c in result["candidates"])
    # the tree at the trained length, whatever chain length won: a tree verifies its budget at any depth
    trees = [c for c in result["candidates"] if c["setting"]["tree_budget"]]
    assert [c["setting"]["tree_budget"] for c in trees] == [16, 16] and trees[0]["setting"]["draft_max"] == longest
    # ... then its floor (--quick: one, 0.4), at the same budget and length
    assert [(c["stages"], c["setting"]["tree_p_min"]) for c in trees] == [(["draft tree"], None), (["tree floor"], 0.4)]
    assert trees[1]["setting"]["draft_max"] == longest and trees[1]["error"] is None
    confirmed = result["best_drafting"]
    assert confirmed["stages"] == ["confirmation"] and confirmed["servers"] == 1
    # 3 passes over 6 prompts, unless it fell so far behind the target alone that it was stopped early
    assert confirmed["pairs"] == 3 * 6 or (confirmed["abandoned"] and confirmed["speedup"] < 0.33)
    assert result["drafting_pays"] == (result["speedup"] is not None and result["speedup"] >= 1.05)
    # the controller parks where drafting cannot pay (tau 1: no draft verified); a static length drafts
    assert (1.0 <= confirmed["tau"] if confirmed["setting"]["draft_max"] == "auto" else 1.0 < confirmed["tau"]) \
        and confirmed["tau"] <= longest + 1

    # saved under this target, drafter and build; what the user fixed (-t 1) is part of what serve repeats
    key = tuned.TuneKey.of(target, draft, build_info(llama_bin, None)["build"])
    assert Path(result["saved"]) == key.path() and key.path().parent == tuned_home
    record = tuned.load(key)
    assert record["chosen"] == result["chosen"] and record["chosen"]["threads"] == 1

    answer, stderr, log = _serve(target, draft, llama_bin, tmp_path / "serve.log")
    assert "tuned: " in stderr and "n_threads = 1" in log
    if result["drafting_pays"]:
        assert answer.draft_n > 0
        assert f"n_max={result['chosen']['draft_max']}," in log
    else:
        assert "WITHOUT the drafter" in stderr and answer.draft_n == 0 and "adding speculative" not in log


@pytest.mark.integration
def test_serve_runs_a_saved_drafting_setting_and_the_users_arguments_win(trained_pair: dict[str, Path],
                                                                        llama_bin: Path, tmp_path: Path, tuned_home):
    target, draft = trained_pair["target"], trained_pair["dflash2"]
    key = tuned.TuneKey.of(target, draft, build_info(llama_bin, None)["build"])
    tuned.save(key, _record(Setting(True, threads=1, draft_max=3, p_min=0.3), True))

    answer, stderr, log = _serve(target, draft, llama_bin, tmp_path / "a.log")
    assert "tuned: -t 1 --spec-draft-p-min 0.3 --spec-draft-n-max 3 from" in stderr
    assert "n_max=3, n_min=0, p_min=0.30" in log and "n_threads = 1" in log and answer.draft_n > 0

    answer, stderr, log = _serve(target, draft, llama_bin, tmp_path / "b.log", "--", "--spec-draft-n-max", "2")
    assert "n_max=2, n_min=0, p_min=0.30" in log and answer.draft_n > 0

    answer, stderr, log = _serve(target, draft, llama_bin, tmp_path / "c.log", "--no-tuned", "--", "-t", "1")
    assert "tuned" not in stderr and "n_max=7, n_min=0, p_min=0.00" in log


@pytest.mark.integration
def test_a_drafter_that_cannot_pay_is_measured_so_and_serve_runs_the_target_alone(tiny_pair, llama_bin: Path,
                                                                                  tmp_path: Path, tuned_home):
    target, draft = tiny_pair  # random weights: almost nothing accepted, every step dearer than a token
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def fibonacci(n):\\n\nThe history of the printing press\nSolve for x: 3x + 7 = 22.\n")
    # threads and draft length fixed after --, to keep it short: the drafter, p_min, a tree at that length
    result = _tune(target, draft, llama_bin, "--prompts", prompts, "-n", "16", "--", "-t", "1",
                   "--spec-draft-n-max", "2")
    assert [c["stages"] for c in result["candidates"]] == [["threads, drafter"], ["p_min"], ["draft tree"],
                                                          ["tree floor"]]
    assert [c["setting"]["tree_budget"] for c in result["candidates"][-2:]] == [16, 16]
    assert result["candidates"][-1]["setting"]["tree_p_min"] == 0.4
    assert result["drafting_pays"] is False and result["speedup"] < 1.05, result["speedup"]
    assert result["chosen"] == {"drafting": False, "threads": 1, "draft_max": None, "p_min": None, "tree_budget": None,
                                "tree_p_min": None}

    answer, stderr, log = _serve(target, draft, llama_bin, tmp_path / "alone.log")
    assert "drafting does not pay here" in stderr and "WITHOUT the drafter" in stderr
    assert "the target alone" in stderr and answer.n_predicted > 0 and answer.draft_n == 0
    assert "adding speculative" not in log

    # (-t 1: llama.cpp's default of every core crawls on a loaded 2-core machine)
    answer, stderr, log = _serve(target, draft, llama_bin, tmp_path / "drafting.log", "--no-tuned", "--", "-t", "1")
    assert answer.draft_n > 0 and "adding speculative" in log


@pytest.mark.integration
def test_fresh_servers_confirm_each_pass_on_a_new_pair(tiny_pair, llama_bin: Path, tmp_path: Path, tuned_home):
    """--fresh-servers: the confirmation's 3 passes (--quick) each on a new pair of servers, the target alone's
    and the setting's; the search as without it (one server per setting)."""
    target, draft = tiny_pair
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def fibonacci(n):\\n\nThe history of the printing press\n")
    proc = dflash_gguf("tune", "-t", target, "-d", draft, "--quick", "--json", "--llama-bin", llama_bin,
                       "--prompts", prompts, "-n", "8", "--fresh-servers", "--", "-t", "1", "--spec-draft-n-max", "2",
                       cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    confirmed = result["best_drafting"]
    assert result["settings"]["fresh_servers"] is True and "a new pair of servers each pass" in proc.stderr
    assert confirmed["stages"] == ["confirmation"] and confirmed["servers"] == confirmed["runs"] == 3
    assert confirmed["pairs"] == 3 * 2
    assert all(c["servers"] == 1 for c in result["candidates"]), [c["servers"] for c in result["candidates"]]


@pytest.mark.parametrize("args, message", [
    (["-md", "d.gguf"], "-md after --: the drafter is --draft; it cannot be given to llama-server here"),
    (["--port", "8080"], "--port after --: tune runs two servers at a time, each on a free port; leave it out"),
])
def test_tune_refuses_what_the_runner_manages_before_anything_starts(tiny_pair, tmp_path: Path, tuned_home: Path,
                                                                    args, message):
    target, draft = tiny_pair
    proc = dflash_gguf("tune", "-t", target, "-d", draft, "--", *args, cwd=tmp_path)
    assert assert_refused(proc) == f"error: {message}" and proc.stdout == ""
    assert not tuned_home.exists()


def test_tune_and_bench_refuse_rounds_0_which_only_validate_takes(tiny_pair, tmp_path: Path, tuned_home: Path):
    """--rounds 0 is validate's proof without speed; tune and bench measure nothing else."""
    target, draft = tiny_pair
    for command in ("tune", "bench"):
        proc = dflash_gguf(command, "-t", target, "-d", draft, "--rounds", "0", cwd=tmp_path)
        assert assert_refused(proc) == (f"error: --rounds 0: {command} measures speed; give 1 or more (at least 3 "
                                        "for a figure that can stand), or leave it out") and proc.stdout == ""
    assert not tuned_home.exists()


@pytest.mark.integration
def test_max_seconds_ends_the_search_but_the_verdict_is_still_measured(tiny_pair, llama_bin: Path, tmp_path: Path,
                                                                       tuned_home: Path):
    target, draft = tiny_pair
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def fibonacci(n):\\n\nThe history of the printing press\n")
    # a draft length beyond the drafter's trained 7 is the user's: clamped by the launch, not refused
    result = _tune(target, draft, llama_bin, "--prompts", prompts, "-n", "8", "--max-seconds", "0", "--",
                   "-t", "1", "--spec-draft-n-max", "99")
    assert result["stopped_before"] == "p_min"
    assert [c["stages"] for c in result["candidates"]] == [["threads, drafter"]]
    assert result["best_drafting"]["stages"] == ["confirmation"] and result["best_drafting"]["pairs"] > 0
    assert result["chosen"] == {"drafting": False, "threads": 1, "draft_max": None, "p_min": None, "tree_budget": None,
                                "tree_p_min": None}
