"""Every judgement about speed the tools print follows the numbers it judges: tune's verdict, serve's
start-up line, `make demo`'s closing lines and `make bench`'s notes, each on numbers both sides of its
line (runner/speed_verdict.py is where the words come from)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench, regimes
from dflash_gguf.runner import tuned_settings as tuned
from dflash_gguf.runner.tune import Setting
from dflash_gguf.runner.tune_cli import print_table
from dflash_gguf.runner.speed_verdict import DEFAULT_MIN_SPEEDUP, batch_cost_verdict, drafting_pays, speed_verdict
from examples.demo import verdict_lines

PAYS, DOES_NOT_PAY = "drafting pays here", "drafting does not pay here"


# --- the words --------------------------------------------------------------------------------

@pytest.mark.parametrize("speedup, pays, words", [
    (2.07, True, "drafting pays here: 2.07x the target alone (at least 1.05x)"),
    (1.05, True, "drafting pays here: 1.05x the target alone (at least 1.05x)"),
    (1.049, False, "drafting does not pay here: 1.049x the target alone, under the 1.05x it must reach"),
    (1.0, False, "drafting does not pay here: 1.00x the target alone, under the 1.05x it must reach"),
    (0.9996, False, "drafting does not pay here: 0.9996x the target alone, slower than without it"),
    (0.55, False, "drafting does not pay here: 0.55x the target alone, slower than without it"),
    (None, False, "no speedup was measured here"),
])
def test_the_verdict_is_the_speedup_against_its_line(speedup, pays, words):
    assert drafting_pays(speedup) is pays
    assert speed_verdict(speedup) == words


def test_the_line_and_the_place_are_the_callers():
    assert DEFAULT_MIN_SPEEDUP == 1.05
    assert speed_verdict(1.3, 1.5) == "drafting does not pay here: 1.30x the target alone, under the 1.5x it must reach"
    assert speed_verdict(1.6, 1.5, where="") == "drafting pays: 1.60x the target alone (at least 1.5x)"
    assert speed_verdict(0.8, where="on this target").startswith("drafting does not pay on this target: 0.80x")


@pytest.mark.parametrize("cost, words", [
    (1.2, "a batch of 8 tokens costs 1.20x one decoded token: verifying a block is close to free here"),
    (1.499, "a batch of 8 tokens costs 1.499x one decoded token: verifying a block is close to free here"),
    (1.5, "a batch of 8 tokens costs 1.50x one decoded token: verifying a block is not free here, and a "
          "drafter's speedup is at most 0.67 of its tau"),
    (4.0, "a batch of 8 tokens costs 4.00x one decoded token: verifying a block is not free here, and a "
          "drafter's speedup is at most 0.25 of its tau"),
])
def test_the_cost_of_a_batch_is_judged_by_what_it_costs(cost, words):
    assert batch_cost_verdict(cost, 8) == words


# --- tune ------------------------------------------------------------------------------------

def _tune_result(speedup: float, min_speedup: float = 1.05) -> dict:
    spec = {"label": "drafter -t 1 n_max 4", "tau": 3.65, "pairs": 18, "runs": 3, "tokens_per_second": 200.0,
            "speedup_quartiles": [1.6, 2.3]}
    alone = {"label": "target -t 1", "tokens_per_second": 100.0}
    return {"candidates": [], "best_drafting": spec, "target_alone": alone,
            "settings": {"prompts": 6, "n_predict": 32, "min_speedup": min_speedup}, "speedup": speedup,
            "speedup_unreliable": None,
            "confirmation": {"speedup": speedup, "speedup_unreliable": None, "speedup_unit": "paired pass",
                             "speedup_runs": [speedup] * 3, "speedup_range": [speedup, speedup]},
            "drafting_pays": speedup >= min_speedup, "chosen_label": "x", "llama": {"backend": "cpu", "build": "b"}}


@pytest.mark.parametrize("speedup, words", [(2.07, PAYS + ": 2.07x"), (1.05, PAYS + ": 1.05x"),
                                            (1.04, DOES_NOT_PAY + ": 1.04x"), (0.55, DOES_NOT_PAY + ": 0.55x")])
def test_tune_prints_the_verdict_of_its_confirmed_speedup(speedup, words, capsys):
    print_table(_tune_result(speedup), saved=None)
    (verdict,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("verdict")]
    assert words in verdict


# --- serve ------------------------------------------------------------------------------------

def _record(speedup: float, drafting: bool) -> dict:
    chosen = Setting(True, 1, 4) if drafting else Setting(False, 1)
    return {"chosen": chosen.to_dict(), "drafting_pays": drafting, "speedup": speedup,
            "best_drafting": {"label": "drafter -t 1 n_max 4", "tau": 3.2, "pairs": 18},
            "settings": {"min_speedup": 1.05}, "finished_at": "2026-12-01T00:00:00Z"}


@pytest.mark.parametrize("speedup, words", [(2.07, PAYS + ": 2.07x"), (1.051, PAYS + ": 1.05x")])
def test_serve_says_drafting_pays_from_the_tuned_speedup(speedup, words):
    record = _record(speedup, drafting=True)
    line = tuned.announce(record, tuned.apply(record, None, ()), Path("/c/k.json"), "t.gguf")
    assert line.startswith("tuned: -t 1 --spec-draft-n-max 4 from /c/k.json: " + words)
    assert "WITHOUT" not in line


@pytest.mark.parametrize("speedup, words", [(1.049, DOES_NOT_PAY + ": 1.049x"), (0.55, DOES_NOT_PAY + ": 0.55x")])
def test_serve_says_drafting_does_not_pay_from_the_tuned_speedup(speedup, words):
    record = _record(speedup, drafting=False)
    line = tuned.announce(record, tuned.apply(record, None, ()), Path("/c/k.json"), "t.gguf")
    assert line.startswith("tuned: " + words)
    assert "Serving t.gguf WITHOUT the drafter, -t 1" in line


# --- make demo --------------------------------------------------------------------------------

def test_the_demo_closes_with_each_drafters_verdict():
    reports = {"dflash": {"speedup": 1.08, "mean_acceptance_length": 3.1},
               "dflash2": {"speedup": 1.41, "mean_acceptance_length": 4.2},
               "dspark": {"speedup": 0.81, "mean_acceptance_length": 6.2}}
    lines = verdict_lines(reports)
    assert lines[0] == "DFlash: " + PAYS + ": 1.08x the target alone (at least 1.05x); tau 3.10"
    assert lines[1].startswith("DFlash 2: " + PAYS + ": 1.41x")
    assert lines[2].startswith("dspark: " + DOES_NOT_PAY + ": 0.81x")


# --- make bench -------------------------------------------------------------------------------

def _regime_row(regime: str, speedup: float, verify_tokens: float) -> dict:
    return {"regime": regime, "type": "Q8_0", "drafter": "dflash2", "speedup": speedup, "tau": 6.43,
            "verify_tokens": verify_tokens, "block": 8}


@pytest.mark.parametrize("speedup, verify, words", [
    (3.64, 1.54, "drafting pays: 3.64x the target alone"),
    (1.03, 2.42, "drafting does not pay: 1.03x the target alone, under the 1.05x"),
    (0.86, 1.2, "drafting does not pay: 0.86x the target alone, slower"),
])
def test_bench_section_f_judges_each_regime_by_its_best_row(speedup, verify, words):
    line = regimes._verdict("memory-bound", _regime_row("memory-bound", speedup, verify), bench.DRAFTER_LABELS)
    assert line.startswith(f"- **memory-bound target**: {words}")
    assert batch_cost_verdict(verify, 8) in line


def _bench_results(speedup: float) -> dict:
    decode = {"drafter": "dflash", "type": "F16", "parallel": 1, "speedup": speedup, "tau": 8.76, "exact": True,
              "divergences": []}
    profile = {"drafter": "dflash", "bench_batch_ms": 0.74, "bench_ms_per_token": 0.17, "step_over_token": 10.37,
               "draft_ms_per_step": 0.74, "verify_ms_per_step": 1.40, "target_ms_per_token": 0.21, "tau": 8.76,
               "block_size": 16}
    return {"decode": [decode], "recipes": [], "parity": [], "profile": [profile], "target_mib": 11.1}


@pytest.mark.parametrize("speedup, words", [(0.81, "does not pay: 0.81x"), (1.04, "does not pay: 1.04x")])
def test_bench_explains_a_speedup_that_does_not_pay(speedup, words):
    (note,) = bench.observations(_bench_results(speedup))
    assert note.startswith(f"DFlash F16: drafting {words} the target alone")
    assert "a batch of 16 tokens costs 4.35x one decoded token: verifying a block is not free here" in note


@pytest.mark.parametrize("speedup", [1.05, 2.5])
def test_bench_has_nothing_to_explain_where_drafting_pays(speedup):
    assert bench.observations(_bench_results(speedup)) == []
