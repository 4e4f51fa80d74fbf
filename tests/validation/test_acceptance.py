"""validation/acceptance.py: draft lengths, parked steps and per-depth acceptance from logged steps; the
run's limit from the controller's costs."""

from __future__ import annotations

import pytest

from dflash_gguf.validation.acceptance import depth_profile, limit_fields, limit_line, run_limit, time_lines, time_split
from dflash_gguf.validation.server_steps import Step


def _step(n: int, accepted: int | None, **kw) -> Step:
    return Step(position=0, width=n + 1, last=1, accepted=accepted, **kw)


def test_lengths_parked_share_and_conditional_acceptance_by_depth():
    steps = [_step(3, 3), _step(3, 1), _step(3, 0), _step(1, 1), _step(0, None),
             _step(3, 2, restored_from=5), _step(3, 3, replay=True)]  # the last two verify nothing new
    profile = depth_profile(steps)
    assert profile["steps"] == 5 and profile["draft_lengths"] == {"0": 1, "1": 1, "3": 3}
    assert profile["parked_share"] == 0.2
    by_depth = {d["depth"]: d for d in profile["per_depth"]}
    assert by_depth[1] == {"depth": 1, "offered": 4, "accepted": 3, "rate": 0.75, "conditional": 0.75}
    # depth 2 offered by the three 3-draft steps; two of them had depth 1 accepted, one took depth 2
    assert by_depth[2]["offered"] == 3 and by_depth[2]["accepted"] == 1 and by_depth[2]["conditional"] == 0.5
    assert by_depth[3]["accepted"] == 1 and by_depth[3]["conditional"] == 1.0


def test_a_run_with_no_steps_has_no_profile():
    assert depth_profile([]) == {"steps": 0, "draft_lengths": {}, "parked_share": None, "per_depth": []}


def _auto(produced: int, by_accepted: list[int], verify=(10.0, 11.0, 12.0, 13.0, 14.0), draft=(3.0,)):
    return {"predicted_n": produced, "draft_verify_cost_ms": list(verify), "draft_pass_cost_ms": list(draft),
            "draft_full_offered_per_depth": [10, 8, 6, 4], "draft_full_accepted_per_depth": [8, 6, 4, 2],
            "draft_full_tokens_by_accepted": by_accepted}


def test_the_limit_serves_each_stretch_at_its_best_length_in_hindsight():
    # a token of a stretch whose block is accepted to depth L costs min over n <= L of (3 + verify(n + 1)) / (n + 1):
    # L = 0: 10 ms (plain), L = 2: 15 / 3 = 5 ms, L = 4: 17 / 5 = 3.4 ms; against 10 ms a token
    run = _auto(49, [8, 0, 10, 0, 30])
    # one length for the whole run: n = 4 (17 ms a step) serves the 8 tokens at 17 ms, the 10 at 17 / 3
    # and the 30 at 3.4: 294.67 ms, where n = 2 (15 ms) takes 8 * 15 + 10 * 5 + 30 * 5 = 320 and n = 0 480
    one = 8 * 17 + 10 * 17 / 3 + 30 * 3.4
    assert run_limit([run]) == {"limit": round(48 * 10 / 232, 3), "best_lengths": {"0": 8, "2": 10, "4": 30},
                                "verify_ms": 10.0, "slots": 1, "ms_per_token": round(232 / 48, 6),
                                "one_length": {"limit": round(480 / one, 3), "length": 4,
                                               "ms_per_token": round(one / 48, 6)}}
    # a stretch counts by its tokens, not by its blocks: one probe standing for 40 parked tokens at L = 0
    # weighs 40 against 8 tokens drafted at L = 4 (the per-depth counts of the blocks would weigh 1 against 2)
    parked = run_limit([_auto(49, [40, 0, 0, 0, 8])])
    assert parked["best_lengths"] == {"0": 40, "4": 8} and parked["limit"] == round(48 * 10 / (400 + 8 * 3.4), 3)
    # blocks never accepted, or accepted where even a known length costs more a token than a plain step: 1.0
    assert run_limit([_auto(49, [48])]) == {"limit": 1.0, "best_lengths": {"0": 48}, "verify_ms": 10.0, "slots": 1,
                                            "ms_per_token": 10.0, "one_length": {
                                                "limit": 1.0, "length": 0, "ms_per_token": 10.0}}
    dear = run_limit([_auto(49, [0, 0, 48], verify=(10.0, 25.0, 40.0))])
    assert dear["limit"] == 1.0 and dear["best_lengths"] == {"0": 48}


def test_more_slots_price_the_wider_batch_and_a_static_run_has_no_limit():
    deep = _auto(49, [0, 0, 0, 0, 48], verify=[10.0] + [10.0 + 4 * b for b in range(1, 10)])
    one, two = run_limit([deep], 1), run_limit([deep], 2)
    assert two["limit"] < one["limit"] and two["verify_ms"] == 14.0
    static = {"predicted_n": 48, "draft_offered_per_depth": [10], "draft_accepted_per_depth": [5]}
    assert run_limit([static]) is None and limit_fields([static], 0.9) == {} and limit_line({}) is None
    # a build before 0024: the per-depth counts alone give no limit
    older = {k: v for k, v in deep.items() if k != "draft_full_tokens_by_accepted"}
    assert run_limit([older]) is None


def test_measured_over_limit_is_withheld_with_the_speedup():
    run = _auto(49, [0, 0, 0, 0, 48])  # 3.4 ms a token: 2.941x
    assert limit_fields([run], 1.5)["measured_over_limit"] == round(1.5 / 2.941, 3)
    withheld = limit_fields([run], None)
    assert withheld["measured_over_limit"] is None
    line = limit_line(withheld)
    assert "not measured reliably" in line and "limit 2.94x" in line and "tokens by length 4: 48" in line


def test_the_time_below_the_limit_is_split_into_named_parts():
    """Patch 0020's parts: 12 steps drafting 4 and 4 parked steps made 40 tokens in 250 ms after the
    prompt's (predicted_n 41), against 3.4 ms a token at the limit (every stretch accepted to depth 4)."""
    run = {**_auto(41, [0, 0, 0, 0, 40]), "draft_n_chosen_hist": [4, 0, 0, 0, 12], "predicted_ms": 250.0,
           "spec_time_ms": {"target": 200.0, "draft": 40.0, "feed": 5.0, "sample": 3.0}}
    time = limit_fields([run], 1.2)["time"]
    assert time["parts_ms"] == {"target": 200.0, "draft": 40.0, "feed": 5.0, "sample": 3.0, "rest": 2.0}
    below = time["below_limit"]
    lost = below["lost_ms_per_token"]
    # priced: 4 plain steps (10 ms) + 12 steps of a draft pass (3 ms) and 5 tokens (14 ms) = 244 ms
    assert lost["draft_lengths"] == pytest.approx((244 - 40 * 3.4) / 40, abs=1e-3)
    assert lost["target"] == pytest.approx((200 - 208) / 40) and lost["draft_passes"] == pytest.approx((40 - 36) / 40)
    assert (lost["feed"], lost["sample"], lost["rest"]) == (0.125, 0.075, 0.05)
    assert sum(lost.values()) == pytest.approx(below["measured_ms_per_token"] - below["limit_ms_per_token"], abs=1e-3)
    lines = time_lines({"time": time})
    assert lines[0].startswith("time by part: the target's steps 80.0%") and "0.25 s generating" in lines[0]
    assert lines[1].startswith("below the limit: 6.250 ms per token against 3.400") and "drafter feed +0.125" in lines[1]


def test_a_static_run_has_its_time_parts_but_no_limit_and_a_stock_build_neither():
    static = {"predicted_n": 10, "predicted_ms": 100.0, "draft_offered_per_depth": [10], "draft_accepted_per_depth": [5],
              "spec_time_ms": {"target": 60.0, "draft": 30.0, "feed": 4.0, "sample": 1.0}}
    assert limit_fields([static], 0.9) == {"time": {"generation_ms": 100.0, "tokens": 9, "parts_ms": {
        "target": 60.0, "draft": 30.0, "feed": 4.0, "sample": 1.0, "rest": 5.0}}}
    assert len(time_lines(limit_fields([static], 0.9))) == 1
    assert time_split([{k: v for k, v in static.items() if k != "spec_time_ms"}]) is None


def test_each_response_is_priced_at_its_own_servers_costs():
    """Two new servers of one run (fresh rounds), one twice as slow: each made 40 tokens at its own
    prices (its target's steps and draft passes took what they were priced at). Priced at one server's table, the slow one's steps would read as
    the target's steps beyond their price and the fast one's as time saved."""
    def run(scale: float) -> dict:
        priced = scale * (4 * 10 + 12 * (3 + 14))
        return {**_auto(41, [0, 0, 0, 0, 40], verify=[scale * v for v in (10.0, 11.0, 12.0, 13.0, 14.0)],
                        draft=(scale * 3.0,)),
                "draft_n_chosen_hist": [4, 0, 0, 0, 12], "predicted_ms": priced,
                "spec_time_ms": {"target": scale * 208.0, "draft": scale * 36.0, "feed": 0.0, "sample": 0.0}}
    runs = [run(1.0), run(2.0)]
    limit = run_limit(runs)
    assert limit["limit"] == round(10 / 3.4, 3) and limit["verify_ms"] == 15.0
    lost = time_split(runs)["below_limit"]["lost_ms_per_token"]
    assert lost["target"] == 0.0 and lost["draft_passes"] == 0.0
    # the lengths chosen, each at its server's prices (244 and 488 ms), against 40 tokens at 3.4 and 6.8 ms
    assert lost["draft_lengths"] == pytest.approx((244 + 488 - 40 * 3.4 - 40 * 6.8) / 80, abs=1e-3)


def test_hindsight_is_what_the_best_single_length_loses_to_each_stretch_at_its_own():
    """Two requests of 47 tokens after their first, stretches accepted to 0, 2 and 4 (8, 9 and 30 tokens)
    in the first and 4 (47) in the second. The best single length is n = 4: 8 + 3 + 6 steps of 17 ms
    (289 ms; n = 2 would take 8 * 15 + 9 * 5 + 30 * 5 = 315) and 47 * 3.4 = 159.8 ms, against 8 * 10 +
    9 * 5 + 30 * 3.4 = 227 ms with each stretch of the first at its own best length. The first request
    ran at n = 4 throughout: its 62 ms between are hindsight. The second chose a plain step and 10 steps
    at n = 4: 180 ms against the 159.8 n = 4 throughout would have taken."""
    first = {**_auto(48, [8, 0, 9, 0, 30]), "draft_n_chosen_hist": [0, 0, 0, 0, 17], "predicted_ms": 289.0,
             "spec_time_ms": {"target": 17 * 14.0, "draft": 17 * 3.0, "feed": 0.0, "sample": 0.0}}
    second = {**_auto(48, [0, 0, 0, 0, 47]), "draft_n_chosen_hist": [1, 0, 0, 0, 10], "predicted_ms": 180.0,
              "spec_time_ms": {"target": 10.0 + 10 * 14.0, "draft": 10 * 3.0, "feed": 0.0, "sample": 0.0}}
    speed = limit_fields([first, second], 1.5)
    one = 289 + 47 * 3.4
    assert speed["limit"]["one_length"] == {"limit": round(940 / one, 3), "length": 4, "ms_per_token": round(one / 94, 6)}
    lost = speed["time"]["below_limit"]["lost_ms_per_token"]
    assert lost["hindsight"] == pytest.approx((289 - 227) / 94, abs=1e-3)
    assert lost["draft_lengths"] == pytest.approx((10 + 170 - 47 * 3.4) / 94, abs=1e-3)
    assert lost["target"] == lost["draft_passes"] == 0.0
    assert speed["measured_over_one_length_limit"] == round(1.5 / round(940 / one, 3), 3)
    line = limit_line(speed)
    assert "2.09x at the best single length (n 4)" in line and "/ the best single length's 0.72" in line
    assert "hindsight (where blocks are accepted) +0.660" in time_lines(speed)[1]
