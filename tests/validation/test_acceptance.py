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


def _auto(produced: int, offered: list[int], accepted: list[int], verify=(10.0, 11.0, 12.0, 13.0, 14.0), draft=(3.0,)):
    return {"predicted_n": produced, "draft_verify_cost_ms": list(verify), "draft_pass_cost_ms": list(draft),
            "draft_full_offered_per_depth": offered, "draft_full_accepted_per_depth": accepted}


def test_the_limit_is_the_best_length_per_request_at_the_measured_costs():
    # a_1..a_4 = 0.8, 0.75, 2/3, 0.5: E(4) = 1 + .8 + .6 + .4 + .2 = 3.0 tokens for 3 + 14 ms against 10 ms a token
    deep = _auto(48, [10, 8, 6, 4], [8, 6, 4, 2])
    assert run_limit([deep]) == {"limit": 1.765, "best_lengths": {"4": 1}, "verify_ms": 10.0, "slots": 1,
                                 "ms_per_token": round(17 / 3, 6)}
    # a request whose drafts are never accepted is best served by plain steps: the limit is 1.0
    shallow = _auto(48, [10, 2, 0, 0], [1, 0, 0, 0])
    assert run_limit([shallow])["limit"] == 1.0 and run_limit([shallow])["best_lengths"] == {"0": 1}
    # weighted by tokens: 48 at 10/1.765 ms and 48 at 10 ms
    both = run_limit([deep, shallow])
    assert both["best_lengths"] == {"0": 1, "4": 1} and both["limit"] == round(96 * 10 / (48 * 17 / 3 + 48 * 10), 3)


def test_more_slots_price_the_wider_batch_and_a_static_run_has_no_limit():
    deep = _auto(48, [10, 8, 6, 4], [8, 6, 4, 2], verify=[10.0] + [10.0 + 4 * b for b in range(1, 10)])
    one, two = run_limit([deep], 1), run_limit([deep], 2)
    assert two["limit"] < one["limit"] and two["verify_ms"] == 14.0
    static = {"predicted_n": 48, "draft_offered_per_depth": [10], "draft_accepted_per_depth": [5]}
    assert run_limit([static]) is None and limit_fields([static], 0.9) == {} and limit_line({}) is None


def test_measured_over_limit_is_withheld_with_the_speedup():
    deep = _auto(48, [10, 8, 6, 4], [8, 6, 4, 2])
    assert limit_fields([deep], 1.5)["measured_over_limit"] == round(1.5 / 1.765, 3)
    withheld = limit_fields([deep], None)
    assert withheld["measured_over_limit"] is None
    assert "not measured reliably" in limit_line(withheld) and "limit 1.76x" in limit_line(withheld)


def test_the_time_below_the_limit_is_split_into_named_parts():
    """Patch 0020's parts: 12 steps drafting 4 (E 3 tokens each) and 4 parked steps made 40 tokens in
    250 ms after the prompt's (predicted_n 41), against 17/3 ms a token at the limit (every step drafting 4)."""
    run = {**_auto(41, [10, 8, 6, 4], [8, 6, 4, 2]), "draft_n_chosen_hist": [4, 0, 0, 0, 12], "predicted_ms": 250.0,
           "spec_time_ms": {"target": 200.0, "draft": 40.0, "feed": 5.0, "sample": 3.0}}
    time = limit_fields([run], 1.2)["time"]
    assert time["parts_ms"] == {"target": 200.0, "draft": 40.0, "feed": 5.0, "sample": 3.0, "rest": 2.0}
    below = time["below_limit"]
    lost = below["lost_ms_per_token"]
    # priced: 4 plain steps (10 ms) + 12 steps of a draft pass (3 ms) and 5 tokens (14 ms) = 244 ms
    assert lost["draft_lengths"] == pytest.approx((244 - 40 * 17 / 3) / 40, abs=1e-3)
    assert lost["target"] == pytest.approx((200 - 208) / 40) and lost["draft_passes"] == pytest.approx((40 - 36) / 40)
    assert (lost["feed"], lost["sample"], lost["rest"]) == (0.125, 0.075, 0.05)
    assert sum(lost.values()) == pytest.approx(below["measured_ms_per_token"] - below["limit_ms_per_token"], abs=1e-3)
    lines = time_lines({"time": time})
    assert lines[0].startswith("time by part: the target's steps 80.0%") and "0.25 s generating" in lines[0]
    assert lines[1].startswith("below the limit: 6.250 ms per token against 5.667") and "drafter feed +0.125" in lines[1]


def test_a_static_run_has_its_time_parts_but_no_limit_and_a_stock_build_neither():
    static = {"predicted_n": 10, "predicted_ms": 100.0, "draft_offered_per_depth": [10], "draft_accepted_per_depth": [5],
              "spec_time_ms": {"target": 60.0, "draft": 30.0, "feed": 4.0, "sample": 1.0}}
    assert limit_fields([static], 0.9) == {"time": {"generation_ms": 100.0, "tokens": 9, "parts_ms": {
        "target": 60.0, "draft": 30.0, "feed": 4.0, "sample": 1.0, "rest": 5.0}}}
    assert len(time_lines(limit_fields([static], 0.9))) == 1
    assert time_split([{k: v for k, v in static.items() if k != "spec_time_ms"}]) is None
