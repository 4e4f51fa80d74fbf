"""The docs hold what they promise: README.md is a five-minute read, every link lands on a file and a
section that exist, and every command, option and make target the README and docs/ show (the README's
walk-through and command table above all) is one the tools have.

No llama.cpp needed: the command line is inspected in-process (click's own command objects and
their `--help`)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from dflash_gguf.cli import main as cli
from tests.conftest import REPO

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md")),
         REPO / "training" / "README.md", REPO / "benchmarks" / "README.md"]
MAX_README_LINES = 200
WALK_THROUGH = "Five commands on a real model"

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"`([^`]+)`")
OPTION = re.compile(r"(?<![\w\-])(--?[A-Za-z][\w\-]*)")


def _outside_fences(text: str) -> list[str]:
    """The lines of `text` outside fenced code blocks."""
    out, in_fence = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            in_fence = not in_fence
        elif not in_fence:
            out.append(line)
    return out


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code spans (links there are not links)."""
    return "\n".join(CODE_SPAN.sub("", line) for line in _outside_fences(text))


def _fenced_blocks(text: str) -> list[str]:
    blocks, current = [], None
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def anchors(text: str) -> set[str]:
    """GitHub's section anchors: the heading lower-cased, punctuation dropped, spaces to hyphens,
    a repeated heading suffixed -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for line in _outside_fences(text):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    """Each relative link of `page` whose file, or whose `#section` in that file, does not exist."""
    broken = []
    for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not ours to check offline
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            broken.append(f"{target}: no section #{anchor} in {dest.name}")
    return broken


def _command(words: list[str]) -> tuple[click.Command, list[str], list[str]]:
    """The (sub)command `words` name under `dflash-gguf`, its path, and the words after it."""
    command, path = cli, []
    while isinstance(command, click.Group) and words and words[0] in command.commands:
        command = command.commands[words[0]]
        path.append(words.pop(0))
    return command, path, words


def _help(command: click.Command, path: list[str]) -> str:
    with click.Context(command, info_name=" ".join(["dflash-gguf", *path])) as ctx:
        return command.get_help(ctx)


def _declared(command: click.Command) -> set[str]:
    return {name for p in command.params if isinstance(p, click.Option) for name in (*p.opts, *p.secondary_opts)}


def unknown_options(line: str) -> list[str]:
    """What a shown `dflash-gguf ...` command names that the command line does not have: a subcommand,
    or an option (before `--`, where llama-server's own begin) missing from the command or its --help."""
    words = line.split()
    if not words or words[0] != "dflash-gguf":
        raise ValueError(f"not a dflash-gguf command: {line}")
    command, path, rest = _command(words[1:])
    if isinstance(command, click.Group):
        return [f"`dflash-gguf {' '.join(path + rest[:1])}`: no such command"]
    ends = [i for i, word in enumerate(rest) if word in ("--", "[--", "(--")]
    rest = rest[:ends[0]] if ends else rest
    declared, shown = _declared(command), _help(command, path)
    problems = []
    for word in rest:
        for option in OPTION.findall(word.split("=", 1)[0]):
            if option not in declared:
                problems.append(f"`dflash-gguf {' '.join(path)}` has no option {option}")
            elif not re.search(rf"(?<![\w\-]){re.escape(option)}(?![\w\-])", shown):
                problems.append(f"`dflash-gguf {' '.join(path)} --help` does not list {option}")
    return problems


def _section(text: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"README.md has no section '## {title}'"
    return m.group(1)


def shown_commands(text: str) -> list[str]:
    """The dflash-gguf commands of the text's code blocks, continuation lines joined, comments cut."""
    joined = "\n".join(_fenced_blocks(text)).replace("\\\n", " ")
    return [" ".join(shlex.split(line, comments=True)) for line in joined.splitlines()
            if line.strip().startswith("dflash-gguf")]


def walk_through_commands(text: str) -> list[str]:
    """The dflash-gguf commands of the README's walk-through."""
    commands = shown_commands(_section(text, WALK_THROUGH))
    assert commands, f"README.md's '{WALK_THROUGH}' shows no commands"
    return commands


def make_targets_shown(text: str) -> set[str]:
    """The make targets named in the page's code: `make X` opening a code span, a line of a code block or a
    command after `;`/`&&` (a message quoted in code that says "make stock" is not a target)."""
    code = _fenced_blocks(text) + CODE_SPAN.findall("\n".join(_outside_fences(text)))
    return {m for chunk in code for m in re.findall(r"(?:^|\n|;|&&)\s*make ([a-z][\w\-]*)", chunk)}


def _makefile_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w\-]*):", (REPO / "Makefile").read_text(), re.M))


# --- the docs ---------------------------------------------------------------------------------

def test_readme_is_a_five_minute_read():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines (at most {MAX_README_LINES}): move detail to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_reaches_its_file_and_section(page):
    assert broken_links(page) == []


def test_every_page_the_readme_promises_exists_and_is_linked():
    linked = {t.partition("#")[0] for t in LINK.findall(_prose(README.read_text(encoding="utf-8")))}
    for name in ("convert", "llama", "validate", "speed", "release", "testing", "benchmarks"):
        assert (REPO / "docs" / f"{name}.md").is_file(), f"docs/{name}.md is missing"
        assert f"docs/{name}.md" in linked, f"README.md does not link docs/{name}.md"


def test_the_walk_through_runs_the_five_commands_with_options_that_exist():
    commands = walk_through_commands(README.read_text(encoding="utf-8"))
    assert [c.split()[1] for c in commands] == ["convert", "validate", "tune", "serve", "release"]
    assert [p for c in commands for p in unknown_options(c)] == []


def test_the_command_reference_and_the_readme_table_are_current():
    """docs/cli.md and the README's table are generated from click (dflash_gguf/cli_docs.py)."""
    proc = subprocess.run([sys.executable, "-m", "dflash_gguf.cli_docs", "--check", str(REPO)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr


def test_every_command_s_help_has_examples():
    from dflash_gguf import cli_docs

    missing = [ctx.command_path for ctx, command in cli_docs.commands()
               if not re.search(rf"^\s+\S*{re.escape(ctx.command_path)}\b", command.help or "", re.M)]
    assert missing == [], f"no example (an indented `dflash-gguf ...` line) in the --help of {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_command_a_page_shows_exists(page):
    assert [p for c in shown_commands(page.read_text(encoding="utf-8")) for p in unknown_options(c)] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_make_target_shown_exists(page):
    assert make_targets_shown(page.read_text(encoding="utf-8")) - _makefile_targets() == set()


# --- the checks themselves catch what they are for ---------------------------------------------

def test_a_missing_file_or_section_is_a_broken_link(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## A `code` heading: with (punctuation)\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n## Here\n\n"
                    "[ok](other.md) [ok](other.md#a-code-heading-with-punctuation) [ok](#here) [ok](other.md#twice-1)\n"
                    "[ok](https://example.com/missing.md) `[not a link](nowhere.md)`\n\n"
                    "```\n[not a link](nowhere.md)\n```\n"
                    "[bad](missing.md) [bad](other.md#nowhere) [bad](#gone) [bad](other.md#twice-2)\n")
    assert [b.split(":")[0] for b in broken_links(page)] == [
        "missing.md", "other.md#nowhere", "#gone", "other.md#twice-2"]


def test_an_option_or_command_the_cli_lacks_is_found():
    assert unknown_options("dflash-gguf tune -t t.gguf -d d.gguf --quick --json -- --no-such-server-flag") == []
    assert unknown_options("dflash-gguf tune -t t.gguf -d d.gguf [--quick] [-- -ngl 99]") == []
    assert unknown_options("dflash-gguf llama build --backend cuda --cuda-arch 90") == []
    assert unknown_options("dflash-gguf tune -t t.gguf --no-such-option") == [
        "`dflash-gguf tune` has no option --no-such-option"]
    assert unknown_options("dflash-gguf serve -t t.gguf -d d.gguf --outtype=f16") == [
        "`dflash-gguf serve` has no option --outtype"]
    assert unknown_options("dflash-gguf frobnicate x") == ["`dflash-gguf frobnicate`: no such command"]
    assert unknown_options("dflash-gguf llama frobnicate") == ["`dflash-gguf llama frobnicate`: no such command"]


def test_the_walk_through_is_read_as_a_user_reads_it():
    text = ("## Five commands on a real model\n\n```sh\nT=t.gguf  # a comment\n"
            "dflash-gguf convert src --target $T \\\n    -o d.gguf  # --not-an-option\n"
            "dflash-gguf serve -t $T -d d.gguf -- -c 8192\n```\n\n## Next\n\n")
    assert walk_through_commands(text) == ["dflash-gguf convert src --target $T -o d.gguf",
                                           "dflash-gguf serve -t $T -d d.gguf -- -c 8192"]
    assert make_targets_shown("`make demo`, `make no-such-target` and\n```sh\nmake test  # x\n```\n") == {
        "demo", "no-such-target", "test"}


def _leaf_commands(command: click.Command, path: tuple[str, ...] = ()):
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from _leaf_commands(sub, (*path, name))
    else:
        yield " ".join(path), command


def test_the_readme_names_the_commands_without_json():
    """README's `--json` line names the commands that lack it (issue 50: it said "everywhere")."""
    lines = _outside_fences(README.read_text(encoding="utf-8"))
    start = next(i for i, line in enumerate(lines) if line.startswith("- `--json`"))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("  "))
    item = " ".join(lines[start:end])
    stated = set(CODE_SPAN.findall(item.partition(" but ")[2].split("(", 1)[0]))
    lacking = {path for path, command in _leaf_commands(cli) if "--json" not in _declared(command)}
    assert stated == lacking, f"README.md's --json line: the commands without --json are {sorted(lacking)}"


def test_the_zoo_page_lists_every_family():
    from training.fixtures.toys import FAMILIES

    text = "\n".join(_outside_fences((REPO / "docs" / "testing.md").read_text(encoding="utf-8")))
    listed = re.search(r"published drafters target \((\d+): ([^)]*)\)", text)
    assert listed, "docs/testing.md: the zoo's paragraph lists its families as '(N: a, b, ...)'"
    names = [n.strip() for n in listed.group(2).split(",")]
    assert (int(listed.group(1)), names) == (len(FAMILIES), list(FAMILIES))
