"""benchmarks/controller.py: the draft-length controller beside the target alone, with `--alone-again`'s
second target-alone server in the same rounds (an A/A pair that shows the rounds' own spread)."""

from __future__ import annotations

import pytest

from benchmarks import controller
from dflash_gguf.runner.prompts import read_prompts
from training.fixtures.trained_gguf import trained_ggufs

pytestmark = pytest.mark.integration


def test_a_second_target_alone_is_measured_in_the_same_rounds(tmp_path, llama_bin):
    files = trained_ggufs(tmp_path)
    texts = read_prompts(files["prompts"])[:2]
    row = controller.measure(files["target"], files["dflash2"], texts, rounds=3, n_predict=8, bin_dir=llama_bin,
                             statics="none", alone_again=True)
    assert set(row["tokens_per_second"]) == {controller.ALONE, controller.ALONE_AGAIN, "auto"}, row["tokens_per_second"]
    aa = row["alone_again_over_alone"]
    low, high = aa["interval"]
    assert aa["range"][0] <= low <= aa["median"] <= high <= aa["range"][1], aa
    assert 0.2 < aa["median"] < 5.0, aa  # two servers of one model and build: within a factor of the machine's noise
    assert row["identical"] == {"auto": True}, row["identical"]  # the A/A server is the reference's twin, not a setting
    assert row["best_static"] is None and row["auto_over_alone"]["speedup_runs"] is not None


def test_without_it_the_row_has_no_a_a_pair(tmp_path, llama_bin):
    files = trained_ggufs(tmp_path)
    row = controller.measure(files["target"], files["dflash2"], read_prompts(files["prompts"])[:1], rounds=1,
                             n_predict=4, bin_dir=llama_bin, statics="none")
    assert "alone_again_over_alone" not in row and controller.ALONE_AGAIN not in row["tokens_per_second"]
