"""`dflash-gguf validate --temperature T` on the trained pair and the real patched llama-server: a run
whose distribution is the target's passes, a deliberately shifted one is caught."""

from __future__ import annotations

import json

import pytest

from dflash_gguf.validation.validate import is_report
from dflash_gguf.validation.validate_sampled import Sampling
from tests.conftest import cli, dflash_gguf
from tests.refusal import assert_refused
from training.fixtures.gguf_edit import scaled_copy

pytestmark = pytest.mark.integration

COMMON = ["--temperature", "0.6", "--threads", "1", "--parallel", "4", "--backend", "cpu"]


@pytest.fixture(scope="module")
def first_prompts(trained_pair, tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text("".join(trained_pair["prompts"].read_text().splitlines(keepends=True)[:3]))
    return path


def _validate(trained_pair, prompts, out, *args):
    proc = dflash_gguf("validate", "--target", trained_pair["target"], "--draft", trained_pair["dflash"],
                       "--prompts", prompts, *COMMON, "--report", out, *args)
    return proc, json.loads(out.read_text())


def test_same_distribution_passes(trained_pair, first_prompts, tmp_path):
    proc, report = _validate(trained_pair, first_prompts, tmp_path / "r.json", "--samples", "100")
    d = report["distribution"]
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    # the JSON's keys, as before the report was typed (validation/validate_sampled.py DistributionReport)
    assert list(report) == ["distribution", "prompts", "mean_acceptance_length", "acceptance_rate", "drafted",
                            "accepted", "produced", "settings", "launch", "llama", "warnings", "finished_at"]
    assert list(report["prompts"][0]) == ["prompt", "samples", "produced", "draft_n", "draft_n_accepted"]
    assert d["verdict"] == "same" and d["p_value"] >= 0.01 and not d["differing"]
    assert (d["samples"], d["positions"]) == (100, Sampling.positions)
    assert d["tests"] > 0 and "chi-square" in d["test"]
    assert report["drafted"] > 0 and report["accepted"] > 0  # the drafter did take part
    assert report["produced"] == 3 * 100 * Sampling.positions
    assert "distribution            same" in proc.stdout
    assert is_report(tmp_path / "r.json")  # a later --report may replace it


def test_a_tree_at_temperature_is_tested_as_the_chain_that_serves_it(trained_pair, first_prompts, tmp_path):
    """Issue 47's sampling rule: with `--spec-tree-budget` the server verifies sampled requests with the chain
    (no multi-draft rejection sampling), so the distribution test passes and says it tested the chain."""
    proc, report = _validate(trained_pair, first_prompts, tmp_path / "r.json", "--samples", "100", "--",
                             "--spec-tree-budget", "8")
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert report["distribution"]["verdict"] == "same" and report["drafted"] > 0
    assert report["settings"]["tree_budget"] == 8 and "--spec-tree-budget" in report["launch"]["speculative_command"]
    (warning,) = [w for w in report["warnings"] if "--spec-tree-budget" in w]
    assert "verified these sampled requests with the chain" in warning and warning in proc.stdout + proc.stderr


def test_shifted_distribution_is_caught_at_the_default_sample_size(trained_pair, first_prompts, tmp_path):
    """The baseline's logits are scaled by 1.3 (output_norm.weight x 1.3): temperature 0.6 / 1.3."""
    shifted = scaled_copy(trained_pair["target"], tmp_path / "shifted.gguf", "output_norm.weight", 1.3)
    proc, report = _validate(trained_pair, first_prompts, tmp_path / "r.json", "--baseline", shifted)
    d = report["distribution"]
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert d["verdict"] == "different" and d["p_value"] < 0.01 and d["samples"] == Sampling.samples
    assert d["differing"] and all(t["p_value"] < 0.01 for t in d["differing"])
    assert "distribution            different" in proc.stdout


@pytest.mark.parametrize("args, needle", [
    (["--samples", "50"], "--temperature above 0"),
    (["--temperature", "0.6", "--strict"], "greedy"),
    (["--temperature", "-1"], "--temperature"),
])
def test_bad_sampling_input_exits_2(args, needle, trained_pair):
    assert_refused(cli("validate", "--target", trained_pair["target"], "--draft", trained_pair["dflash"], *args),
                   needle)
