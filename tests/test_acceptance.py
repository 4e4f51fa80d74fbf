"""validation/acceptance.py: draft lengths, parked steps and per-depth acceptance from logged steps."""

from __future__ import annotations

from dflash_gguf.validation.acceptance import depth_profile
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
