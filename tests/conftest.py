"""Shared test fixtures: the tiny models, the target as a GGUF, and the pinned upstream converter."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from tests import warm

REPO = Path(__file__).resolve().parents[1]

# One core per pytest worker (-n auto): a llama-server started without -t takes LLAMA_ARG_THREADS
# (llama.cpp's own variable; validate's replay reads it too), PyTorch takes OMP_NUM_THREADS. Left to
# their defaults, each takes every core, and two workers' spinning threads on two cores ran the
# tiny target's validate 5x slower (62 s against 11.5 s). A test that measures threads passes -t.
os.environ.setdefault("LLAMA_ARG_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

pytest_plugins = ["tests.timing", "tests.tiers"]


# Subcommands whose run depends on nothing a fresh process would change: dflash_gguf() runs them in
# this process (2-3 s of imports each, 237 conversions in a full run). With env= (a Hub endpoint,
# read by huggingface_hub at import), they run in a new process like every other subcommand.
IN_PROCESS = frozenset({"convert", "doctor", "inspect", "quantize"})


def dflash_gguf(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None,
                process: bool = False) -> subprocess.CompletedProcess:
    """Run the real command line, as a user would: in a new process (`process=True` forces one;
    forked from a warm one, tests/warm.py), or through cli() for the subcommands in IN_PROCESS."""
    if not process and env is None and args and str(args[0]) in IN_PROCESS:
        return cli(*args, cwd=cwd)
    return warm.run_cli(args, cwd=cwd, env=env)


def cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The same command line in this process (click's CliRunner): milliseconds where a subprocess
    costs seconds of imports. For refusals and usage; what only a new process shows (the entry
    point, signals, an environment read at import such as HF_ENDPOINT) stays with dflash_gguf()."""
    import logging

    from click.testing import CliRunner

    from dflash_gguf.cli import main

    handlers, level, here = logging.root.handlers[:], logging.root.level, os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        result = CliRunner().invoke(main, [str(a) for a in args], prog_name="dflash-gguf", catch_exceptions=False)
    finally:  # main's logging.basicConfig would keep writing to this run's closed streams
        os.chdir(here)
        logging.root.handlers[:] = handlers
        logging.root.setLevel(level)
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


LLAMA_BACKEND = os.environ.get("DFLASH_TEST_BACKEND", "cpu")
LLAMA_BIN_ENV = "DFLASH_GGUF_TEST_LLAMA_BIN"


@pytest.fixture(autouse=True, scope="session")
def _private_tunings(tmp_path_factory) -> None:
    """No test serves with a setting the user's own `dflash-gguf tune` saved (serve would use it)."""
    os.environ["DFLASH_GGUF_TUNED"] = str(tmp_path_factory.mktemp("tuned"))


@pytest.fixture(scope="session")
def llama_bin() -> Path:
    """bin/ of the patched llama.cpp for the current ggml_patches/series, built when the cache
    lacks it (minutes from scratch, incremental after a patch change). `DFLASH_GGUF_TEST_LLAMA_BIN`
    points the tests at another build instead, e.g. an unpatched one, to see what they catch."""
    from dflash_gguf.runner import build

    explicit = os.environ.get(LLAMA_BIN_ENV)
    if explicit:
        return Path(explicit)
    found = build.find_build(LLAMA_BACKEND)
    return Path(found) if found is not None else build.build(backend=LLAMA_BACKEND).bin_dir


@pytest.fixture(scope="session")
def converted(fixtures: Path, target_gguf: Path, tmp_path_factory) -> dict[str, Path]:
    """Every fixture drafter converted for the tiny target by the real command line, default outtype
    (auto: BF16, as the checkpoints are bf16)."""
    from training.fixtures.tiny_models import DRAFTERS

    folder = tmp_path_factory.mktemp("converted")
    out = {}
    for name in sorted(DRAFTERS):
        out[name] = folder / f"dflash-{name}.gguf"
        proc = cli("convert", fixtures / name, "--target", target_gguf, "-o", out[name])
        assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="session")
def fixtures() -> Path:
    from training.fixtures.tiny_models import cached_fixtures

    return cached_fixtures()


@pytest.fixture(scope="session")
def target_gguf(fixtures: Path) -> Path:
    """The tiny target converted by the pinned upstream converter (cached beside the fixtures)."""
    from training.fixtures.upstream import cached_target_gguf

    return cached_target_gguf("f16")


@pytest.fixture(scope="session")
def upstream_gguf(fixtures: Path, tmp_path_factory):
    """upstream_gguf(drafter, outtype): the pinned converter's output for a fixture drafter."""
    from training.fixtures.upstream import run_upstream_converter

    made: dict[tuple[str, str], Path] = {}
    folder = tmp_path_factory.mktemp("upstream")

    def get(drafter: str, outtype: str) -> Path:
        if (drafter, outtype) not in made:
            out = folder / f"{drafter}-{outtype}.gguf"
            made[drafter, outtype] = run_upstream_converter(fixtures / drafter, out, outtype, fixtures / "target-hf")
        return made[drafter, outtype]

    return get


@pytest.fixture
def hub():
    """A local stand-in for the Hugging Face Hub on 127.0.0.1 (tests/local_hub.py)."""
    from tests import local_hub

    server = local_hub.start()
    yield server
    local_hub.stop(server)


@pytest.fixture
def drafter_copy(fixtures: Path, tmp_path: Path):
    """drafter_copy(name): a private, editable copy of a fixture drafter folder."""
    def copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(fixtures / name, dst)
        return dst
    return copy


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory, llama_bin) -> dict[str, Path]:
    """SmolLM2-135M-Instruct's targets (Q4_1 as shipped, F16, Q8_0, Q4_K_M) and its committed
    drafters (dflash, dflash2) as GGUF files (training/fixtures/smollm2.py; the targets are cached)."""
    from training.fixtures.smollm2 import smollm2_ggufs

    return smollm2_ggufs(tmp_path_factory.mktemp("smollm2"), llama_bin)


@pytest.fixture(scope="session")
def smollm2_finetune(tmp_path_factory, llama_bin) -> dict[str, Path]:
    """The SmolLM2 fine-tune that answers like a pirate, F16 and Q4_K_M (training/fixtures/
    smollm2_finetune.py; made once into the cache, about 5 minutes)."""
    from training.fixtures.smollm2 import finetune_ggufs

    return finetune_ggufs(tmp_path_factory.mktemp("smollm2-finetune"), llama_bin)


@pytest.fixture(scope="session")
def trained_pair(tmp_path_factory, llama_bin) -> dict[str, Path]:
    """The committed trained pair as GGUF files: target, dflash, dflash2 and prompts (held-out)."""
    from training.fixtures.trained_gguf import trained_ggufs

    return trained_ggufs(tmp_path_factory.mktemp("trained"))


@pytest.fixture(scope="session")
def family():
    """family(arch): build/fixtures/families/<arch>/ of the target-family zoo (training/fixtures/
    families.py; built into the cache on first use, target-Q4_K_M.gguf only once the patched
    llama.cpp is built), skipping a family whose target could not be built or converted, with the
    error line its status.json records."""
    import json

    from training.fixtures.families import STATUS, family_folder

    def get(arch: str) -> Path:
        folder = family_folder(arch)
        status = json.loads((folder / STATUS).read_text())
        if status.get("F16") != "converted":
            pytest.skip(f"{arch}: {status.get('F16') or status.get('hf')}")
        return folder

    return get
