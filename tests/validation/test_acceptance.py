"""validation/acceptance.py: draft lengths, parked steps and per-depth acceptance from logged steps; the
run's limit from the controller's costs."""

from __future__ import annotations

from dflash_gguf.validation.acceptance import depth_profile, limit_fields, limit_line, run_limit
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
    assert run_limit([deep]) == {"limit": 1.765, "best_lengths": {"4": 1}, "verify_ms": 10.0, "slots": 1}
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
