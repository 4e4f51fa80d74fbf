"""Where the suite's time goes: seconds per test file and per kind of work, printed after the run.

A kind is a slow thing a test does: a llama-server start, a PyTorch reference run, a llama.cpp build,
a conversion (ours in-process, the pinned upstream converter), llama-quantize, and the command line
run as a subprocess (by subcommand; what that subprocess does inside is counted under it). Kinds are
timed as self time: a subprocess run inside a build counts for the build only once, under whichever
was entered last. With pytest-xdist each worker times its own and sends the totals to the controller
(`workeroutput`), which prints one table and writes it as JSON (`DFLASH_GGUF_TEST_TIMINGS`, default
build/test-timings.json) for docs/testing.md.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TIMINGS_FILE = Path(os.environ.get("DFLASH_GGUF_TEST_TIMINGS", REPO / "build" / "test-timings.json"))

_kinds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])  # kind -> [self seconds, count]
_stack: list[list] = []  # [kind, started, paused seconds]


def _enter(kind: str) -> None:
    now = time.perf_counter()
    if _stack:
        outer = _stack[-1]
        _kinds[outer[0]][0] += now - outer[1]
    _stack.append([kind, now])


def _leave() -> None:
    now = time.perf_counter()
    kind, started = _stack.pop()
    _kinds[kind][0] += now - started
    _kinds[kind][1] += 1
    if _stack:
        _stack[-1][1] = now


def timed(kind):
    """Decorator: calls of the function count as `kind` (a string, or a function of the call's args)."""
    def wrap(fn):
        if getattr(fn, "_timed", False):
            return fn

        @functools.wraps(fn)
        def run(*args, **kwargs):
            _enter(kind(*args, **kwargs) if callable(kind) else kind)
            try:
                return fn(*args, **kwargs)
            finally:
                _leave()
        run._timed = True
        return run
    return wrap


def subprocess_kind(args, *_, **__) -> str:
    """What a subprocess.run is, from its command line."""
    argv = [str(a) for a in (args if isinstance(args, (list, tuple)) else [args])]
    if "dflash_gguf.cli" in argv:
        rest = [a for a in argv[argv.index("dflash_gguf.cli") + 1:] if not a.startswith("-")]
        return f"CLI subprocess: {' '.join(rest[:2]) if rest[:1] == ['llama'] else (rest[:1] or ['--'])[0]}"
    names = [Path(a).name for a in argv[:2]]
    for tool in ("llama-quantize", "llama-server", "llama-cli", "llama-bench", "cmake", "git", "pip"):
        if tool in names or any(n.startswith(tool) for n in names):
            return f"subprocess: {tool}"
    return "subprocess: other"


# Product functions timed wherever they are called (module attribute lookups at call time): patched
# once their module is imported, so the fast tier never imports torch for this.
_PRODUCT = {
    "dflash_gguf.runner.server": [("LlamaServer.start", "llama-server start (to ready)")],
    "dflash_gguf.runner.build": [("build", "llama.cpp build")],
    "dflash_gguf.validation.reference": [("speculative_runs", "PyTorch reference")],
    "dflash_gguf.convert.converter": [("convert", "conversion: ours, in-process")],
    "tests.reference_drafts": [("reference_draft", "PyTorch reference")],
    "training.fixtures.upstream": [("_convert", "conversion: pinned upstream converter")],
    "tests.warm": [("run_cli", lambda args, *_, **__: forked_kind(args))],
}


def forked_kind(args) -> str:
    """What a run_cli (tests/warm.py: a child forked from a warm process) is."""
    return subprocess_kind(["-m", "dflash_gguf.cli", *args]).replace("CLI subprocess", "CLI forked")


def _patch_loaded() -> None:
    for module_name, targets in list(_PRODUCT.items()):
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for dotted, kind in targets:
            owner_name, _, attr = dotted.rpartition(".")
            owner = getattr(module, owner_name) if owner_name else module
            setattr(owner, attr, timed(kind)(getattr(owner, attr)))
        del _PRODUCT[module_name]


def pytest_configure(config) -> None:
    subprocess.run = timed(subprocess_kind)(subprocess.run)
    for name in ("dflash_gguf.runner.server", "dflash_gguf.runner.build", "dflash_gguf.convert.converter",
                 "tests.warm"):
        importlib.import_module(name)  # torch-free, cheap; imported now so test modules bind the timed ones
    _patch_loaded()


def pytest_runtest_setup(item) -> None:
    _patch_loaded()


def pytest_runtest_logreport(report) -> None:
    # in the controller (xdist replays its workers' reports there) or in a run without workers
    _file_seconds[report.nodeid.split("::")[0]] += report.duration
    _test_seconds[report.nodeid] += report.duration


_file_seconds: dict[str, float] = defaultdict(float)
_test_seconds: dict[str, float] = defaultdict(float)  # setup + call + teardown
_kind_totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])


def pytest_sessionfinish(session) -> None:
    if hasattr(session.config, "workerinput"):
        session.config.workeroutput["dflash_kinds"] = json.dumps(dict(_kinds))
    else:
        _merge(dict(_kinds))


def _merge(kinds: dict) -> None:
    for kind, (seconds, count) in kinds.items():
        _kind_totals[kind][0] += seconds
        _kind_totals[kind][1] += count


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    kinds = getattr(node, "workeroutput", {}).get("dflash_kinds")
    if kinds:
        _merge(json.loads(kinds))


def pytest_terminal_summary(terminalreporter, config) -> None:
    if hasattr(config, "workerinput") or not _file_seconds:
        return
    files = sorted(_file_seconds.items(), key=lambda kv: -kv[1])
    kinds = sorted(_kind_totals.items(), key=lambda kv: -kv[1][0])
    total = sum(_file_seconds.values())
    tr = terminalreporter
    tr.section("where the time went (test seconds, summed over workers)")
    tr.write_line(f"{'file':<46} {'seconds':>9} {'share':>6}")
    for name, seconds in files[:25]:
        tr.write_line(f"{name:<46} {seconds:9.1f} {seconds / total:6.1%}")
    if len(files) > 25:
        rest = sum(s for _, s in files[25:])
        tr.write_line(f"{f'({len(files) - 25} more files)':<46} {rest:9.1f} {rest / total:6.1%}")
    tr.write_line(f"{'all files':<46} {total:9.1f}")
    tr.write_line("")
    tr.write_line(f"{'kind (self time)':<46} {'seconds':>9} {'count':>6}")
    for kind, (seconds, count) in kinds:
        tr.write_line(f"{kind:<46} {seconds:9.1f} {count:6d}")
    marker = config.getoption("-m") or "(all)"
    record = {"marker": marker, "total_test_seconds": round(total, 1),
              "files": {k: round(v, 1) for k, v in files},
              "kinds": {k: {"seconds": round(s, 1), "count": n} for k, (s, n) in kinds},
              "tests": {k: round(v, 1) for k, v in sorted(_test_seconds.items(), key=lambda kv: -kv[1])}}
    TIMINGS_FILE.parent.mkdir(parents=True, exist_ok=True)
    target = TIMINGS_FILE.with_name(f"{TIMINGS_FILE.stem}-{_slug(marker)}{TIMINGS_FILE.suffix}")
    target.write_text(json.dumps(record, indent=1) + "\n")
    tr.write_line(f"(written to {target})")


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-") or "all"
