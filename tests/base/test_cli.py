"""One command vocabulary: the same flag means the same thing in every command, and every error,
click's usage errors included, is one line on stderr with exit status 2."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from dflash_gguf.cli import main
from dflash_gguf.options import ServerArgsCommand
from tests.conftest import cli, dflash_gguf
from tests.refusal import assert_refused


def _commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    out = {}
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            out.update(_commands(command, f"{prefix}{name} "))
        else:
            out[prefix + name] = command
    return out


COMMANDS = _commands(main)
SERVER_COMMANDS = ("serve", "generate", "validate", "release", "tune", "bench", "doctor")


def test_each_flag_means_one_thing():
    spellings: dict[str, set[tuple[str, ...]]] = {}
    for command in COMMANDS.values():
        for param in command.params:
            if isinstance(param, click.Option):
                for opt in param.opts + param.secondary_opts:
                    spellings.setdefault(opt, set()).add(tuple(sorted(param.opts)))
    mixed = {opt: names for opt, names in spellings.items() if len(names) > 1}
    assert mixed == {}
    assert spellings["-t"] == {("--target", "-t")} and spellings["-d"] == {("--draft", "-d")}
    assert spellings["-m"] == {("--message", "-m")}


def test_json_is_a_flag_everywhere_and_the_build_is_chosen_one_way():
    for name, command in COMMANDS.items():
        options = {opt: p for p in command.params if isinstance(p, click.Option) for opt in p.opts}
        if "--json" in options:
            assert options["--json"].is_flag, name
        if "--llama-bin" in options or "--backend" in options:
            assert {"--llama-bin", "--backend"} <= set(options) or name.startswith("llama "), name
    for name in SERVER_COMMANDS:
        assert isinstance(COMMANDS[name], ServerArgsCommand), name  # extra llama-server args after --


@pytest.mark.parametrize("args, needle", [
    (["serve"], "Missing option '--target'"),
    (["tune", "-t"], "requires an argument"),
    (["validate", "-t"], "requires an argument"),
    (["generate"], "Missing argument 'PROMPT...'"),
    (["generate", "hello"], "give --url of a running server, or --target and --draft"),
    (["convert"], "Missing argument 'SRC'"),
    (["inspect", "--nope"], "--nope"),
    (["quantize", "a.gguf", "b.gguf", "--type", "Q8_0"], "does not exist"),
    (["release", ".", "-o", "x"], "--target/-t: give the target model"),
    (["publish"], "Missing argument 'DIR'"),
    (["llama", "build", "--backend", "vulkan"], "'vulkan' is not one of"),
    (["no-such-command"], "No such command"),
])
def test_usage_errors_are_one_line_exit_2(args, needle, tmp_path: Path):
    proc = cli(*args, cwd=tmp_path)
    assert_refused(proc, needle)
    assert proc.stdout == ""


@pytest.mark.parametrize("args, needle", [(["convert"], "Missing argument 'SRC'"),
                                          (["no-such-command"], "No such command")])
def test_the_installed_entry_point_refuses_the_same_way(args, needle, tmp_path: Path):
    """The in-process runs above stand for the real entry point: a new interpreter says the same."""
    proc = dflash_gguf(*args, cwd=tmp_path)
    assert_refused(proc, needle)
    assert proc.stdout == "" and proc.stderr == cli(*args, cwd=tmp_path).stderr


def test_llama_path_without_a_build_is_one_line_exit_2(tmp_path: Path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "DFLASH_GGUF_CACHE": str(tmp_path / "empty-cache")}
    proc = subprocess.run([sys.executable, "-m", "dflash_gguf.cli", "llama", "path", "--backend", "cpu"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: no llama.cpp build") and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_text_reads_as_written(name):
    """No escape left in a help text (a raw string once printed `target\\'s`), no paragraph twice."""
    with click.Context(COMMANDS[name], info_name=name) as ctx:
        text = COMMANDS[name].get_help(ctx)
    assert "\\'" not in text and '\\"' not in text
    paragraphs = [p.strip() for p in text.split("\n\n") if len(p.strip()) > 40]
    assert len(paragraphs) == len(set(paragraphs))


def _spellings() -> dict[str, set]:
    """Every option spelling -> the (type, range, help) it has in each command."""
    from dflash_gguf.cli_docs import commands

    found: dict[str, set] = {}
    for ctx, command in commands():
        for param in command.params:
            if isinstance(param, click.Option):
                signature = (param.type.name, getattr(param.type, "min", None), getattr(param.type, "max", None),
                             param.help)
                for spelling in param.opts + param.secondary_opts:
                    found.setdefault(spelling, set()).add(signature)
    return found


def test_an_option_spelled_alike_means_one_thing():
    """One spelling, one definition (options.py): the same type, range and help in every command."""
    found = _spellings()
    differing = {s for s, sigs in found.items() if len(sigs) > 1}
    assert differing == set(), {s: found[s] for s in differing}
    assert len(found["--threads"]) == 1 and len(found["--quantize-threads"]) == 1
