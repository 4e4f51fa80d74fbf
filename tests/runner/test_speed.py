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
    # auto parked on nearly every step: the same target steps on both sides, the ratio is the servers' spread
    ([1.01, 0.98, 1.02], 1.002, "2 of the 3 rounds came out above tau 1.00: the speculative server verified almost "
     "no drafted token (parked), so it ran the target's own steps and can at best match it; the rest is the "
     "spread of two servers (slowest round 0.98x)"),
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
    """RoundServers(fresh=True): each round's servers are new llama-server processes, the last
    round's stopped before they start, the one started first rotating by round; without `fresh`
    every round gets the same ones."""
    from dflash_gguf.runner.server import LlamaServer
    from dflash_gguf.runner.speed import RoundServers

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

    with RoundServers({"alone": maker("alone"), "spec": maker("spec")}, True, warm_up) as pairs:
        pids = []
        for r in range(3):
            assert list(pairs.servers(r)) == ["alone", "spec"]
            pids.append([server.pid for server in pairs.servers(r).values()])
            assert all(alive(pid) for pid in pids[-1])
            assert not any(alive(pid) for pair in pids[:-1] for pid in pair)  # stopped before these started
        assert pairs.started == 3
    assert not any(alive(pid) for pid in pids[-1])
    assert started == ["alone", "spec", "spec", "alone", "alone", "spec"]
    assert sorted(warmed) == sorted(pid for pair in pids for pid in pair) and len(set(warmed)) == 6
    with RoundServers({"alone": maker("alone"), "spec": maker("spec")}, False, warm_up) as pairs:
        assert pairs.servers(0) is pairs.servers(1) and pairs.started == 1


def test_the_medians_interval_is_the_sign_tests_and_the_range_below_nine_rounds():
    from dflash_gguf.runner.speed import median_interval

    for n in (3, 5, 8):
        assert median_interval(range(n, 0, -1)) == (1, n)  # no narrower pair of rounds holds 95 %
    assert median_interval(range(1, 10)) == (2, 8)  # 1 - 2 * 10 / 512 = 0.961
    assert median_interval(range(1, 17)) == (4, 13)  # 1 - 2 * 697 / 65536 = 0.979; k = 5 gives 0.923
    assert median_interval(range(1, 31)) == (10, 21)


def test_more_rounds_judge_the_median_by_its_interval_not_the_range():
    """Twelve rounds near 0.98x with one stray each side: the range (0.90-1.06) is wider than the
    effect, but where the median lies (0.965-0.990, 95 %) is not, so the figure stands; three such
    rounds (0.90, 0.98, 1.06) cannot say it."""
    ratios = [0.90, 0.97, 0.98, 0.99, 1.06, 0.965, 0.985, 0.975, 0.99, 0.97, 0.98, 0.965]
    s = judge(ratios, tau=1.5)
    assert s.value == pytest.approx(0.9775) and s.interval == (0.965, 0.99)
    assert shown(s.to_dict()) == ("0.978x (median of 12 rounds, interleaved; range 0.900-1.060; "
                                  "95 % interval of the median 0.965-0.990)")
    assert judge([0.90, 0.98, 1.06], tau=1.5).unreliable.startswith("the 3 rounds range from 0.90x to 1.06x")
    wide = judge([0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 0.85, 1.15], tau=2.0)
    assert wide.unreliable == ("the median of the 9 rounds lies between 0.85x and 1.15x (95 %), wider than the "
                               "effect (median 1.00x)")
