"""benchmarks/controller.py: the draft-length controller beside the target alone, with `--alone-again`'s
second target-alone server in the same rounds (an A/A pair that shows the rounds' own spread), `--p-min`'s
settings and `--other-build`'s autos."""

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


def test_p_min_cuts_the_static_lengths_and_measures_auto_with_it_beside_auto(tmp_path, llama_bin):
    files = trained_ggufs(tmp_path)
    assert controller.settings(files["dflash2"], "block", 0.8) == {
        "n 7 p_min 0.8": (7, ["--spec-draft-p-min", "0.8"]), "auto": ("auto", []),
        "auto p_min 0.8": ("auto", ["--spec-draft-p-min", "0.8"])}
    row = controller.measure(files["target"], files["dflash2"], read_prompts(files["prompts"])[:1], rounds=1,
                             n_predict=8, bin_dir=llama_bin, statics="block", p_min=0.8)
    assert set(row["tokens_per_second"]) == {controller.ALONE, "n 7 p_min 0.8", "auto", "auto p_min 0.8"}
    assert row["best_static"] == "n 7 p_min 0.8"
    ap = row["auto_p_min"]
    assert ap["p_min"] == 0.8 and ap["over_auto"] > 0 and ap["over_best_static"] > 0 and ap["drafting"]["steps"] > 0
    # every setting's tokens are the target alone's: p_min only shortens what is verified
    assert row["identical"] == {"n 7 p_min 0.8": True, "auto": True, "auto p_min 0.8": True}, row["identical"]


def test_another_build_runs_auto_and_auto_at_p_min_beside_this_builds(tmp_path, llama_bin):
    files = trained_ggufs(tmp_path)
    row = controller.measure(files["target"], files["dflash2"], read_prompts(files["prompts"])[:1], rounds=1,
                             n_predict=8, bin_dir=llama_bin, statics="none", other_builds={"twin": llama_bin}, p_min=0.8)
    assert set(row["other_builds"]) == {"auto (twin)", "auto p_min 0.8 (twin)"}, row["other_builds"]
    assert all(o["this_build_over_it"] > 0 for o in row["other_builds"].values())
    assert row["identical"] == {"auto": True, "auto p_min 0.8": True, "auto (twin)": True, "auto p_min 0.8 (twin)": True}
