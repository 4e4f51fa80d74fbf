"""runner/speed.py: when a speedup may be printed, and the order of an interleaved measurement."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_gguf.runner.client import Completion
from dflash_gguf.runner.speed import interleaved_rounds, judge, shown


def test_a_tight_ratio_within_tau_is_a_figure_with_its_range():
    s = judge([1.31, 1.28, 1.35], tau=1.9)
    assert s.value == pytest.approx(1.31) and s.unreliable is None
    assert shown(s.to_dict()) == "1.310x (median of 3 rounds, interleaved; range 1.280-1.350)"


@pytest.mark.parametrize("ratios, tau, why", [
    ([14.7, 13.9, 15.2], 1.96, "3 of the 3 rounds came out above tau 1.96"),  # make demo's own figure
    ([1.2, 1.3, 2.1], 2.0, "1 of the 3 rounds came out above tau 2.00"),
    ([0.9, 1.5, 1.1], 3.0, "the 3 rounds range from 0.90x to 1.50x, wider than the effect (median 1.10x)"),
    ([1.2, 1.25], 3.0, "2 rounds measured, at least 3 are needed"),
])
def test_what_the_run_cannot_support_is_withheld_with_why(ratios, tau, why):
    s = judge(ratios, tau=tau, load=0.5, cores=2)
    assert s.value is None and s.unreliable.startswith(why)
    d = s.to_dict()
    assert d["speedup"] is None and d["speedup_unreliable"] == s.unreliable
    assert shown(d).startswith("not measured reliably here: " + why)
    # no ratio above tau is given anywhere, not even among the raw figures
    assert all(r <= tau for r in d["speedup_runs"]) and (d["speedup_measured"] or 0) <= tau


def test_an_oversubscribed_machine_is_named_with_its_load_and_cores():
    s = judge([0.05, 1.0, 14.7], tau=1.96, load=3.91, cores=2)
    assert s.unreliable.endswith("the machine is oversubscribed (load average 3.91 on 2 cores)")
    assert judge([1.3, 1.3, 1.3], tau=2.0, load=3.91, cores=2).unreliable is None  # a tight run stands


def test_a_narrow_range_near_one_is_still_a_figure():
    assert judge([0.99, 1.01, 1.0], tau=1.5).value == pytest.approx(1.0)


def _answer(tokens: int, ms: float) -> Completion:
    return Completion.from_json({"tokens": [1] * tokens, "tokens_predicted": tokens,
                                 "timings": {"predicted_ms": ms}})


def test_rounds_alternate_which_server_goes_first_by_prompt_and_round():
    sent = []

    def ask(server, ids):
        sent.append((server, tuple(ids)))
        return _answer(10, 100.0 if server == "alone" else 50.0)

    rounds = interleaved_rounds(lambda r: ("alone", "spec"), [[1], [2]], ask, rounds=2)
    assert sent == [("alone", (1,)), ("spec", (1,)), ("spec", (2,)), ("alone", (2,)),
                    ("spec", (1,)), ("alone", (1,)), ("alone", (2,)), ("spec", (2,))]
    assert rounds.ratios == [2.0, 2.0] and rounds.tokens_per_second() == {"target": 100.0, "speculative": 200.0}


@pytest.mark.integration
def test_fresh_server_pairs_are_new_processes_started_in_turn(target_gguf, llama_bin):
    """ServerPairs(fresh=True): each round's two servers are new llama-server processes, the last
    round's stopped before they start, the side started first alternating by round; without
    `fresh` every round gets the same two."""
    from dflash_gguf.runner.server import LlamaServer
    from dflash_gguf.runner.speed import ServerPairs

    started, warmed = [], []

    def maker(side):
        def make():
            started.append(side)
            return LlamaServer(target_gguf, ["-t", "1", "-c", "256"], bin_dir=llama_bin)
        return make

    def warm_up(server):
        warmed.append(server.pid)
        server.client.complete([1, 2, 3], 2, cache_prompt=False)

    def alive(pid):
        return Path(f"/proc/{pid}").exists()

    with ServerPairs((maker("alone"), maker("spec")), True, warm_up) as pairs:
        pids = []
        for r in range(3):
            pids.append([server.pid for server in pairs.pair(r)])
            assert all(alive(pid) for pid in pids[-1])
            assert not any(alive(pid) for pair in pids[:-1] for pid in pair)  # stopped before these started
        assert pairs.started == 3
    assert not any(alive(pid) for pid in pids[-1])
    assert started == ["alone", "spec", "spec", "alone", "alone", "spec"]
    assert sorted(warmed) == sorted(pid for pair in pids for pid in pair) and len(set(warmed)) == 6
    with ServerPairs((maker("alone"), maker("spec")), False, warm_up) as pairs:
        assert pairs.pair(0) is pairs.pair(1) and pairs.started == 1
