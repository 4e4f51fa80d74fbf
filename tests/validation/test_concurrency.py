"""`dflash-gguf bench`: the concurrency curve on the trained pair (the real patched llama-server at
-np 1 and 2, every stream checked against the target alone), and the bookkeeping that decides
identity, per-slot acceptance and where drafting stops paying."""

from __future__ import annotations

import json

import pytest

from dflash_gguf.runner.client import Completion
from dflash_gguf.validation.bench import (ALONE, DRAFTER, BenchReport, Level, Pass, _level, check_levels, deal, repeats,
                                            stops_paying, verdict_line)
from dflash_gguf.errors import ServerArgsError
from tests.conftest import dflash_gguf
from tests.refusal import assert_refused


def answer(tokens: list[int], slot: int, drafted: int = 0, accepted: int = 0, speed: float = 100.0) -> Completion:
    return Completion.from_json({"content": "", "tokens": tokens, "tokens_predicted": len(tokens), "id_slot": slot,
                                 "timings": {"draft_n": drafted, "draft_n_accepted": accepted,
                                             "predicted_per_second": speed}})


def test_prompts_are_dealt_so_every_pass_covers_each_prompt_and_streams_carry_equal_work():
    assert deal(5, 1) == [[0, 1, 2, 3, 4]]
    jobs = deal(5, 2)
    assert [len(j) for j in jobs] == [3, 3] and set(sum(jobs, [])) == set(range(5))
    assert deal(2, 4) == [[0], [1], [0], [1]]
    with pytest.raises(ServerArgsError, match="--concurrency"):
        check_levels([0, 2])
    assert check_levels([4, 1, 4, 2]) == (1, 2, 4)


def test_a_round_goes_over_the_prompts_until_it_lasts_long_enough_to_time():
    # 4 requests of ~30 ms (a small target): 0.12 s a pass, so 17 passes make a round of 2 s
    assert repeats([0.03, 0.03], 4, 2.0) == 17
    assert repeats([1.5, 2.5], 4, 2.0) == 1  # a slow target: one pass is long enough
    assert repeats([0.03], 4, 0) == 1 and repeats([], 4, 2.0) == 1 and repeats([0.0], 4, 2.0) == 1


def test_a_stream_whose_answer_differs_from_the_target_alone_is_not_identical():
    reference = [[1, 2, 3], [4, 5, 6]]
    jobs = deal(2, 2)
    alone = [Pass([[answer([1, 2, 3], 0)], [answer([4, 5, 6], 1)]], 1.0)] * 3
    spec = [Pass([[answer([1, 2, 3], 0, drafted=4, accepted=2)], [answer([4, 5, 9], 1, drafted=4, accepted=0)]],
                 0.5)] * 3
    row = _level(2, jobs, alone, spec, reference)
    assert not row.identical and row.target_alone_identical
    assert [s["identical"] for s in row.streams] == [True, False]
    assert row.streams[1]["differing"] == [{"prompt": 1, "first_divergence": 2}] * 3  # once per round
    assert [(s["slot"], s["acceptance_rate"]) for s in row.slots] == [(0, 0.5), (1, 0.0)]
    # three rounds at 2.0x, tau 2.0: a figure (one round alone would be withheld)
    assert row.aggregate_tokens_per_second == {ALONE: 6.0, DRAFTER: 12.0} and row.speedup == 2.0
    assert _level(2, jobs, alone[:1], spec[:1], reference).speed["speedup_unreliable"] == (
        "1 round measured, at least 3 are needed")
    # a round above tau (the drafter at 3x with tau 2): a measuring error, none of the ratios in the JSON
    faster = [Pass(p.answers, 1 / 3) for p in spec]
    above = _level(2, jobs, alone, faster, reference)
    assert above.speedup is None and above.speedup_runs == [] and "above tau" in above.speed["speedup_unreliable"]
    # the JSON's keys, as before the report was typed (validation/concurrency.py Level, BenchReport)
    assert list(row.to_dict()) == [
        "concurrency", "requests_per_stream", "rounds", "server_pairs", "aggregate_tokens_per_second",
        "per_request_tokens_per_second",
        "speedup", "speedup_runs", "speed", "tau", "acceptance_rate", "slots", "drafting", "identical", "streams", "target_alone_identical",
        "target_alone_streams"]
    report = BenchReport("t.gguf", "d.gguf", [row], {}, {}, {}, [], "2026-12-03T00:00:00Z")
    assert list(report.to_dict()) == ["target", "draft", "identical", "stops_paying_at", "verdict", "levels",
                                      "settings", "launch", "llama", "warnings", "finished_at"]
    assert report.to_dict()["identical"] is False and report.to_dict()["stops_paying_at"] is None


def test_where_drafting_stops_paying_is_read_from_the_curve():
    def rows(*speedups):
        return [Level(2 ** i, 1, 1, 1, {}, {}, s, [s], {"speedup": s}, 1.0, 0.0, [], {}, True, [], True, [])
                for i, s in enumerate(speedups)]

    assert stops_paying(rows(1.8, 1.2, 0.9, 0.7)) == 4
    assert verdict_line(rows(1.8, 1.2, 0.9, 0.7)) == "drafting stops paying at concurrency 4 (0.9x); it pays up to 2 (1.2x)"
    assert verdict_line(rows(1.8, 1.5)) == "drafting pays at every concurrency measured (lowest 1.5x at 2)"
    assert verdict_line(rows(0.8, 0.6)) == "drafting does not pay at any concurrency measured (best 0.8x)"
    # a level whose speedup was withheld is named, never judged
    assert verdict_line(rows(1.8, None, 0.7)) == ("drafting stops paying at concurrency 4 (0.7x); it pays up to 1 "
                                                  "(1.8x); not measured reliably at concurrency 2 (see each "
                                                  "level's speed.speedup_unreliable)")


def test_bench_refuses_slots_and_ports_it_sets_itself(trained_pair):
    for args in (["--", "-np", "4"], ["--", "--port", "8080"], ["--concurrency", "0"]):
        proc = dflash_gguf("bench", "--target", trained_pair["target"], "--draft", trained_pair["dflash"], *args)
        assert_refused(proc)


@pytest.mark.integration
def test_bench_at_one_and_two_streams_is_identical_on_every_stream_under_exact(trained_pair, tmp_path):
    """--exact: batch-invariant kernels, so every stream's answers are the one-slot target alone's bit
    for bit (without it, on a CPU whose kernels round a batch differently, a stream may differ)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(trained_pair["prompts"].read_text().splitlines(keepends=True)[:3]))
    proc = dflash_gguf("bench", "--target", trained_pair["target"], "--draft", trained_pair["dflash"],
                       "--concurrency", "1,2", "--prompts", prompts, "-n", "24", "--rounds", "2", "--json",
                       "--min-round-seconds", "1", "--exact", "--backend", "cpu", "--fresh-servers", "--", "-t", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["identical"] and [r["concurrency"] for r in report["levels"]] == [1, 2]
    assert report["settings"] == {"levels": [1, 2], "n_predict": 24, "rounds": 2, "fresh_servers": True,
                                  "min_round_seconds": 1.0, "prompts": 3, "draft_max": 15, "exact": True}
    assert "--no-repack" in report["launch"]["recipe"]
    # two rounds support no speedup: each level says why, and the verdict judges none
    assert all(r["speedup"] is None and
               r["speed"]["speedup_unreliable"].startswith("2 rounds measured, at least 3 are needed")
               for r in report["levels"])
    assert report["verdict"].startswith("not measured reliably at concurrency 1, 2")
    assert report["launch"]["user_args"] == ["-t", "1"]
    for row in report["levels"]:
        n = row["concurrency"]
        assert row["rounds"] == 2 and len(row["speedup_runs"]) == 2 and row["speed"]["speedup_measured"] > 0
        assert row["server_pairs"] == 2  # --fresh-servers: a new pair for each round
        assert len(row["streams"]) == n and all(s["identical"] for s in row["streams"])
        assert all(s["requests"] == 2 * row["requests_per_stream"] for s in row["streams"])
        # 24 tokens take well under 0.3 s here: a round of 1 s goes over the prompts several times
        assert row["requests_per_stream"] >= 2 * len(deal(3, n)[0]) and row["requests_per_stream"] % len(deal(3, n)[0]) == 0
        assert row["target_alone_identical"]
        assert all(v > 0 for v in row["aggregate_tokens_per_second"].values())
        # every slot the server ran answered and drafted; the trained drafter is accepted often
        assert 1 <= len(row["slots"]) <= n and all(s["drafted"] > 0 for s in row["slots"])
        assert row["tau"] > 1.5 and 0 < row["acceptance_rate"] <= 1
    assert {s["slot"] for s in report["levels"][1]["slots"]} == {0, 1}  # two streams, two slots busy
    table = dflash_gguf("bench", "--target", trained_pair["target"], "--draft", trained_pair["dflash"],
                        "--concurrency", "1", "--prompts", prompts, "-n", "8", "--rounds", "1", "--exact",
                        "--min-round-seconds", "0", "--", "-t", "1")
    assert table.returncode == 0 and "streams" in table.stdout, table.stderr[-2000:]
    # one round supports no figure: the table shows none and says why
    assert "--  " in table.stdout and "-- at 1 stream(s): not measured reliably here: 1 round measured" in table.stdout
