"""`make demo`'s reporting on the reports it reads: validate's JSON report per drafter, `tune --json`
and serve's timings. The demo once crashed in its summary after 40 minutes of work (a report that
had become a dict where an object was expected); these run its summary on real reports, so a change
to one shows here and not at the end of a demo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_gguf.runner.speed import judge
from dflash_gguf.runner.tune import Candidate, Setting, TuneResult, TuneSettings
from examples.demo import summary_lines
from tests.conftest import dflash_gguf
from tests.validation_reports import validation_report

TIMINGS = {"predicted_n": 64, "predicted_per_second": 40.0, "draft_n": 30, "draft_n_accepted": 12}


def _tuning(ratios: list[float], tau_tokens: tuple[int, int, int]) -> dict:
    """A real TuneResult's JSON, its confirmation made of `ratios` (one per paired pass)."""
    produced, accepted, requests = tau_tokens
    best = Candidate(Setting(True, 1, 4), against="target alone", stages=["confirmation"],
                     tokens_per_second=[10.0 * r for r in ratios], reference=[10.0] * len(ratios),
                     ratios=list(ratios), produced=produced, drafted=2 * accepted, accepted=accepted,
                     requests=requests)
    confirmed = best.judged()
    result = TuneResult(target=Path("t.gguf"), draft=Path("d.gguf"), chosen=best.setting, drafting=best,
                        confirmed=confirmed, alone=Setting(False, 1), pays=confirmed.value is not None
                        and confirmed.value >= 1.05, candidates=[best], settings=TuneSettings(), prompts=6,
                        llama={"backend": "cpu", "build": "x"}, draft_length=7, seconds=1.0, stopped="",
                        warnings=[], finished_at="")
    return json.loads(json.dumps(result.to_dict()))


def _report(speedup_ratios: list[float], tau: float) -> dict:
    speed = judge(speedup_ratios, tau).to_dict()
    report = validation_report(mean_acceptance_length=tau, speedup=speed["speedup"], speed=speed)
    return json.loads(json.dumps(report.to_dict()))


def test_the_summary_prints_a_measured_speedup_with_its_range_and_withholds_one_above_tau():
    reports = {"dflash": _report([0.95, 0.97, 0.96], 1.6),
               "dflash2": _report([14.7, 13.9, 15.2], 1.96)}  # the demo's own impossible figure
    text = "\n".join(summary_lines(reports, _tuning([1.06, 1.07, 1.05], (300, 100, 30)), TIMINGS, 8, None))
    assert "0.960x (median of 3 rounds, interleaved; range 0.950-0.970)" in text
    assert "drafting does not pay here: 0.96x the target alone, slower than without it" in text
    # the impossible ratio is never printed as a figure
    assert "14.7" not in text and "15.2" not in text
    assert "not measured reliably here: 3 of the 3 rounds came out above tau 1.96" in text
    assert "DFlash 2: whether drafting pays here is not known" in text
    assert "serve drafts with it" in text


def test_the_summary_of_a_tuning_whose_spread_hides_the_effect_serves_the_target_alone():
    reports = {"dflash2": _report([1.2, 1.3, 1.25], 1.9)}
    tuning = _tuning([0.7, 1.4, 1.05], (300, 100, 30))
    assert tuning["speedup"] is None and tuning["drafting_pays"] is False
    assert "wider than the effect" in tuning["speedup_unreliable"]
    text = "\n".join(summary_lines(reports, tuning, TIMINGS, 8, 1))
    assert "-t 1" in text and "so serve runs the target alone" in text
    assert "not measured reliably here: the 3 paired passes range from 0.70x to 1.40x, wider than the effect" in text


@pytest.mark.integration
def test_the_summary_of_a_real_validate_and_tune_on_the_trained_pair(trained_pair: dict[str, Path], llama_bin: Path,
                                                                     tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DFLASH_GGUF_TUNED", str(tmp_path / "tuned"))
    target, draft = trained_pair["target"], trained_pair["dflash2"]
    report_file = tmp_path / "validate.json"
    validate = dflash_gguf("validate", "-t", target, "-d", draft, "--prompts", trained_pair["prompts"], "-n", "16",
                           "--llama-bin", llama_bin, "--report", report_file, "--", "-t", "1")
    assert validate.returncode == 0, validate.stderr
    tune = dflash_gguf("tune", "-t", target, "-d", draft, "--prompts", trained_pair["prompts"], "--quick", "--json",
                       "-n", "16", "--llama-bin", llama_bin, "--", "-t", "1")
    assert tune.returncode == 0, tune.stderr
    report, tuning = json.loads(report_file.read_text()), json.loads(tune.stdout)

    lines = summary_lines({"dflash2": report}, tuning, TIMINGS, 6, 1)
    text = "\n".join(lines)
    assert lines[0].startswith("== summary") and "DFlash 2 " in text
    # the figure validate printed is the one the summary prints, or both withhold it
    speedup = report["speedup"]
    if speedup is None:
        assert report["speedup_unreliable"] and "not measured reliably here" in text
    else:
        assert speedup <= report["mean_acceptance_length"] and f"{speedup:.2f}x" in text
    assert report["speed"]["speedup_runs"] and len(report["speed"]["speedup_runs"]) == 3
