"""A command's options as one typed, frozen object, checked in one call that reports every problem.

A command declares its settings once: a frozen dataclass deriving from `Settings`, one field per click
option (named as click names the parameter), and its rules in `problems()`: which options go with which
mode, a value that depends on another option, what must be installed. Building the object runs every
rule and raises `OptionErrors` with one line per problem (the command line prints each as `error: ...`
and exits 2), so nobody, the command line or another command building it (release, train and bench
build validate's), holds settings that were not checked. `settings_command` hands a click callback
the object instead of one argument per option:

    @click.command("validate")
    @click.option("--top-k", type=click.IntRange(0), help=...)
    @settings_command(ValidateSettings)
    def validate_command(settings: ValidateSettings) -> None: ...

Adding an option is then its click line, its field and, when it comes with a rule, a line in
`problems()`. Compare simonw's llm, whose `model.Options(**dict(options))` checks a command's options
in one typed call. An option's spelling, type, range, default and help stay on its click line
(dflash_gguf/options.py owns the shared ones): click refuses a value out of its own range before the
settings are built.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import click

from .errors import DflashError, OptionErrors

S = TypeVar("S", bound="Settings")
EXPLICIT = "explicit"  # a field of this name gets the names of the options the user gave (not defaulted)


def option(flag: str, default: Any = None) -> Any:
    """A field whose command-line spelling is not `--` and its name with dashes (`--json` for as_json):
    the spelling messages name it by."""
    return dataclasses.field(default=default, metadata={"flag": flag})


def refusal(check: Callable[..., Any], *args: Any, **kwargs: Any) -> list[str]:
    """The lines an existing one-line check (one that raises a DflashError) refuses with, as problems."""
    try:
        check(*args, **kwargs)
    except DflashError as err:
        return list(getattr(err, "problems", None) or [str(err)])
    return []


class Settings:
    """The base of a command's settings (a frozen dataclass; see the module docstring)."""

    def __post_init__(self) -> None:
        problems = list(self.problems())
        if problems:
            raise OptionErrors(problems)

    def problems(self) -> Iterator[str]:
        """One line per rule these settings break, each naming the option and the fix."""
        return iter(())

    @classmethod
    def flag(cls, name: str) -> str:
        """How the command line spells the field `name`."""
        field = next(f for f in dataclasses.fields(cls) if f.name == name)
        return field.metadata.get("flag", "--" + name.replace("_", "-"))

    def given(self, *names: str) -> list[str]:
        """The spellings of those fields that are set: a value other than None, False or empty (0 is set)."""
        return [self.flag(name) for name in names if _is_set(getattr(self, name))]

    @classmethod
    def from_params(cls: type[S], params: Mapping[str, Any], explicit: Iterable[str] = ()) -> S:
        """The settings from a click command's parameters (every one must be a field)."""
        values = dict(params)
        if any(f.name == EXPLICIT for f in dataclasses.fields(cls)):
            values[EXPLICIT] = frozenset(explicit)
        return cls(**values)


def _is_set(value: Any) -> bool:
    if value is None or value is False:
        return False
    return not (isinstance(value, (tuple, list, frozenset)) and not value)


def explicit_params(ctx: click.Context) -> frozenset[str]:
    """The parameters the user gave (on the command line or in the environment), not left at their default."""
    return frozenset(p.name for p in ctx.command.params
                     if ctx.get_parameter_source(p.name) not in (None, click.core.ParameterSource.DEFAULT))


def settings_command(cls: type[Settings]) -> Callable[[Callable[[Any], Any]], Callable[..., Any]]:
    """Decorate a click callback (innermost, under its options) so that it receives one `cls`, built and
    checked from every parameter click parsed."""

    def decorate(f: Callable[[Any], Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def callback(**params: Any) -> Any:
            return f(cls.from_params(params, explicit_params(click.get_current_context())))

        callback.settings = cls  # what the callback receives (tests/base/test_settings.py reads it)
        return callback

    return decorate
