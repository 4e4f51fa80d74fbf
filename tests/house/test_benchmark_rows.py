"""The benchmarks' helpers that run `validate` turn its report into their table rows: `make bench`
(section b) and `make bench-real` (section g) stopped at their first validation once `validate`
returned a report object instead of a dict, and nothing ran them between two documentation runs."""

from __future__ import annotations

import pytest

from benchmarks import bench, real_target
from dflash_gguf.runner.prompts import read_prompts
from training.fixtures.trained_gguf import trained_ggufs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def trained(tmp_path_factory, llama_bin):
    files = trained_ggufs(tmp_path_factory.mktemp("trained"))
    return files, read_prompts(files["prompts"])[:2]


def test_bench_real_validates_into_a_row(trained, monkeypatch):
    files, prompts = trained
    monkeypatch.setattr(real_target, "N_PREDICT", 16)
    row = real_target._validate(files["target"], files["dflash"], prompts, "cpu", ["-t", "1"], 1, lambda _m: None)
    assert row["runs"] == 1 and row["mismatches"] == 0 and row["draft_max"] > 0, row
    assert row["tau"] > 1.0 and row["tps_target"] > 0 and row["speedup_runs"] == [row["speedup"]], row


def test_bench_validates_into_a_row(trained):
    files, prompts = trained
    models = bench.Models(kind="trained", target=files["target"], drafters={"dflash": files["dflash"]},
                          prompts=prompts, prompts_file=files["prompts"], reference_target=files["target"],
                          reference_drafters={})
    row = bench._row(bench._validate(models, files["dflash"], 16, 1))
    assert row["prompts"] == 2 and row["produced"] == 32 and "mismatch" not in row["divergences"], row
    assert row["tau"] > 1.0 and row["tps_speculative"] > 0, row
