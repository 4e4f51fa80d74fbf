"""Each command's options are one typed settings object, checked in one call that reports every problem
at once (dflash_gguf/settings.py), and no command function takes a parameter per option."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
from pathlib import Path

import pytest

from dflash_gguf.cli_docs import commands
from dflash_gguf.errors import OptionErrors
from dflash_gguf.options import ServerArgsCommand
from dflash_gguf.release.release import ReleaseSettings
from dflash_gguf.runner.tune import TuneSettings
from dflash_gguf.settings import EXPLICIT
from dflash_gguf.validation.validate import ValidationSettings
from tests.conftest import cli

MAX_PARAMETERS = 12


def _called(callback) -> dict[str, int]:
    """The project's functions `callback` calls by a module-level name (an import inside it, e.g. train's
    torch-only pipeline, is left out): qualified name -> number of parameters."""
    fn = inspect.unwrap(callback)
    found = {}
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(fn)))):
        if not isinstance(node, ast.Call):
            continue
        target = None
        if isinstance(node.func, ast.Name):
            target = fn.__globals__.get(node.func.id)
        elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
            module = fn.__globals__.get(node.func.value.id)
            target = getattr(module, node.func.attr, None) if isinstance(module, types.ModuleType) else None
        if inspect.isfunction(target) and target.__module__.startswith("dflash_gguf"):
            found[f"{target.__module__}.{target.__qualname__}"] = len(inspect.signature(target).parameters)
    return found


def test_no_command_function_takes_more_than_12_parameters():
    counts = {}
    for ctx, command in commands():
        if command.callback is not None:
            counts[ctx.command_path] = len(inspect.signature(command.callback).parameters)
            counts.update(_called(command.callback))
    over = {name: n for name, n in counts.items() if n > MAX_PARAMETERS}
    assert not over, over
    assert all(counts[f"dflash-gguf {name}"] == 1 for name in ("validate", "release", "train", "serve", "tune"))


def test_every_option_of_a_settings_command_is_a_field_of_its_settings():
    """A click line without its field (or a field no option fills) would fail only when the command runs."""
    checked = []
    for ctx, command in commands():
        settings = getattr(command.callback, "settings", None)
        if settings is None:
            continue
        params = {p.name for p in command.params} | ({"server_args"} if isinstance(command, ServerArgsCommand)
                                                     else set())
        fields = {f.name for f in dataclasses.fields(settings) if f.init} - {EXPLICIT}
        assert params == fields, (ctx.command_path, params ^ fields)
        checked.append(ctx.command_path.split()[-1])
    assert {"validate", "release", "train", "bench", "generate", "serve", "tune"} <= set(checked)


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """Two files for --target and --draft: the settings are refused before either is read."""
    target, draft = tmp_path / "t.gguf", tmp_path / "d.gguf"
    target.write_bytes(b"not read")
    draft.write_bytes(b"not read")
    return target, draft


def test_validate_reports_every_problem_at_once(pair, tmp_path):
    report = tmp_path / "report.json"
    proc = cli("validate", "-t", pair[0], "-d", pair[1], "--top-k", "0", "--seed", "1", "--reference-target", tmp_path,
               "--report", report)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert lines == ["error: --top-k: a sampling option; give --temperature above 0 with it (greedy runs are "
                     "checked token by token)",
                     "error: --seed: a sampling option; give --temperature above 0 with it (greedy runs are "
                     "checked token by token)",
                     "error: --reference-draft and --reference-target go together"]
    assert not report.exists()


def test_release_reports_every_problem_at_once(tmp_path):
    proc = cli("release", tmp_path, "--into", "a/b", "--push", "c/d", "--types", "F16,Q9", "--skip-validate",
               "--", "-c", "512")
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert len(lines) == 3 and all(line.startswith("error: ") for line in lines), lines
    assert "--into and --push: give one" in lines[0] and "--types 'Q9'" in lines[1]
    assert "--skip-validate runs no server" in lines[2]


def test_serve_reports_every_problem_at_once(pair, tmp_path):
    log = tmp_path / "server.log"
    proc = cli("serve", "-t", pair[0], "-d", pair[1], "--no-draft", "--rpc", "10.0.0.2:50052", "--log", log, "--",
               "--rpc", "10.0.0.3:50052")
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        "error: serve: --no-draft serves the target alone; give it or --draft, not both",
        "error: --rpc is 10.0.0.2:50052 but 10.0.0.3:50052 after --; give it once"]
    assert not log.exists()


def test_tune_reports_every_problem_at_once(pair, tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_GGUF_TUNED", str(tmp_path / "tuned"))
    proc = cli("tune", "-t", pair[0], "-d", pair[1], "--rpc", "10.0.0.2:50052", "--", "--port", "8080")
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert len(lines) == 2 and all(line.startswith("error: ") for line in lines), lines
    assert lines[0] == "error: --port after --: tune runs two servers at a time, each on a free port; leave it out"
    assert lines[1].startswith("error: --rpc: tune runs two llama-servers side by side")
    assert not (tmp_path / "tuned").exists()


def test_what_tune_measures_with_is_checked_as_tune_checks_it():
    """The benchmarks build tune's settings as the command line does: its rules apply."""
    with pytest.raises(OptionErrors) as refused:
        TuneSettings(quick=True, server_args=["--port", "8080", "--rpc", "10.0.0.2:50052"])
    assert [p.split(":")[0] for p in refused.value.problems] == ["--port after --", "--rpc"]
    assert TuneSettings(server_args=["-t", "1"]).server_args == ["-t", "1"]


def test_what_release_builds_for_validate_is_checked_as_validate_checks_it():
    """release, train and bench build validate's settings through its one constructor: its rules apply."""
    built = ReleaseSettings(draft_dir="d", target="t", types="F16", out_dir="o", server_args=("-c", "512"),
                            exact=True).validation()
    assert isinstance(built, ValidationSettings) and (built.server_args, built.exact) == (["-c", "512"], True)
    assert ReleaseSettings(draft_dir="d", target="t", types="F16", out_dir="o", skip_validate=True).validation() is None
    with pytest.raises(OptionErrors) as refused:
        ValidationSettings(reference_target=Path("x"), rpc="nohost")
    assert [p.split(":")[0] for p in refused.value.problems] == ["--reference-draft and --reference-target go together",
                                                                 "--rpc 'nohost'"]
