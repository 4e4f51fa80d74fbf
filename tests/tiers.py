"""The suite's tiers, set from what a test uses, so that no test can sit in the wrong one.

- `integration`: the test takes `llama_bin` (the patched build), directly or through another fixture
  (`smollm2`, `trained_pair`, ...);
- `upstream`: it takes the pinned upstream converter's output (`target_gguf`, `upstream_gguf`);
- `install`: it takes the package built as a wheel and installed into a new venv (`wheel_venv`);
- `torch`: its module imports PyTorch or transformers, or the test does when it runs;
- `serial`: it measures the machine (set by hand: what it measures is not a fixture).

`make test` runs everything; `make test-fast` (DFLASH_GGUF_FAST_TIER=1) runs what is none of the
first four. In the fast tier PyTorch and transformers cannot be imported and llama.cpp cannot be
built or started: a module that imports them is left out (reported as skipped, naming the module),
and a test that reaches them without saying so fails with the marker it should carry.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

import pytest

TIER_OF_FIXTURE = {"llama_bin": "integration", "target_gguf": "upstream", "upstream_gguf": "upstream",
                   "wheel_venv": "install"}
FAST_TIER_ENV = "DFLASH_GGUF_FAST_TIER"
HEAVY_MODULES = ("torch", "transformers", "dflash")
_NOT_IN_FAST_TIER = "not in the fast tier"


def fast_tier() -> bool:
    return bool(os.environ.get(FAST_TIER_ENV))


class _HeavyImportBlocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY_MODULES:
            raise ModuleNotFoundError(f"{name}: {_NOT_IN_FAST_TIER} (mark the test `torch`)", name=name)
        return None


class SlowWorkInFastTier(RuntimeError):
    pass


def _refuse(what: str, marker: str):
    def refuse(*_, **__):
        raise SlowWorkInFastTier(f"{what}: {_NOT_IN_FAST_TIER}; the test should take `llama_bin` "
                                 f"(or be marked `{marker}`)")
    return refuse


def pytest_configure(config) -> None:
    if not fast_tier():
        return
    sys.meta_path.insert(0, _HeavyImportBlocker())
    from dflash_gguf.runner import build, server

    server.LlamaServer.start = _refuse("llama-server start", "integration")
    build.build = _refuse("llama.cpp build", "integration")


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        for fixture, marker in TIER_OF_FIXTURE.items():
            if fixture in item.fixturenames:
                item.add_marker(marker)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if fast_tier() and report.failed and _NOT_IN_FAST_TIER in str(report.longrepr):
        report.outcome = "skipped"
        report.longrepr = (str(collector.path), 0, f"Skipped: imports PyTorch, {_NOT_IN_FAST_TIER}")
