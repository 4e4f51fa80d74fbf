"""The `dflash-gguf` command line: parse, call the library, print. Errors become one line and exit 2."""

from __future__ import annotations

import logging
import os
import sys
import warnings

import click

from . import __version__
from .convert.cli import commands as convert_commands
from .errors import DflashError
from .hub.transport import check_environment
from .inputs import reading
from .quantize.cli import commands as quantize_commands
from .release.cli import commands as release_commands
from .runner.llama_cli import commands as llama_commands
from .runner.serve_cli import commands as serve_commands
from .runner.tune_cli import commands as tune_commands
from .runner.watch import commands as watch_commands
from .secrets import ScrubbingStream, filter_log_handlers, scrub
from .signals import exit_status, raise_on_terminate, signal_name
from .terminal import shown
from .train.cli import commands as train_commands
from .validation.bench_cli import commands as bench_commands
from .validation.doctor_cli import commands as doctor_commands
from .validation.validate_cli import commands as validate_commands


ERROR_LINE_LIMIT = 2000  # characters of an error line; a value quoted from a file can be megabytes


def _one_line(text: str) -> str:
    """`text` as one line for the terminal: scrubbed, escaped, and cut at ERROR_LINE_LIMIT (scrubbed
    first, so a cut never leaves part of a token that the filter would no longer recognise)."""
    line = shown(" ".join(scrub(text).split()))
    if len(line) <= ERROR_LINE_LIMIT:
        return line
    return f"{line[:ERROR_LINE_LIMIT]}... ({len(line) - ERROR_LINE_LIMIT} more characters cut)"


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A library's warning (a FutureWarning, a UserWarning...) said as the program's own: one scrubbed line."""
    click.echo(f"warning: {_one_line(f'{category.__name__}: {message}')}", err=True)


class _Group(click.Group):
    def main(self, args=None, prog_name=None, **kwargs):
        """Every error is one line on stderr, click's usage errors too (exit 2); whatever is written
        on stdout or stderr passes the secret filter (secrets.py)."""
        for stream in (sys.stdout, sys.stderr):  # a path that is not UTF-8 is printed escaped, never a traceback
            if hasattr(stream, "reconfigure"):
                stream.reconfigure(errors="backslashreplace")
        warnings.showwarning = _show_warning
        try:  # before anything imports huggingface_hub, which parses them (a traceback otherwise)
            check_environment()
        except DflashError as err:
            sys.stderr.write(f"error: {shown(_one_line(str(err)))}\n")  # names no secret
            sys.exit(err.exit_code)
        stdout, stderr = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = ScrubbingStream(stdout), ScrubbingStream(stderr)
        try:
            self._main(args, prog_name, **kwargs)
        finally:
            if isinstance(sys.stdout, ScrubbingStream):  # not when a closed pipe put devnull there
                sys.stdout = stdout
            sys.stderr = stderr

    def _main(self, args=None, prog_name=None, **kwargs):
        try:
            code = super().main(args, prog_name or "dflash-gguf", standalone_mode=False, **kwargs)
        except click.exceptions.NoArgsIsHelpError as err:  # a bare group: its help, as click shows it
            click.echo(err.ctx.get_help(), err=True)
            sys.exit(err.exit_code)
        except click.UsageError as err:
            where = err.ctx.command_path if err.ctx is not None else "dflash-gguf"
            click.echo(f"error: {_one_line(err.format_message())} (see `{where} --help`)", err=True)
            sys.exit(err.exit_code)
        except click.ClickException as err:
            click.echo(f"error: {_one_line(err.format_message())}", err=True)
            sys.exit(err.exit_code)
        except (KeyboardInterrupt, click.Abort):
            click.echo("error: interrupted", err=True)
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: click.Context):
        try:
            with raise_on_terminate(), reading():
                return super().invoke(ctx)
        except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM, SIGHUP: cleaned up on the way out
            status = exit_status(stop)
            click.echo(f"interrupted ({signal_name(status)})", err=True)
            sys.exit(status)
        except DflashError as err:
            for problem in getattr(err, "problems", None) or [str(err)]:  # OptionErrors: one line each
                click.echo(f"error: {_one_line(problem)}", err=True)
            sys.exit(err.exit_code)
        except BrokenPipeError:  # `dflash-gguf inspect --json x | head`: the reader left, as click treats it
            sys.stdout = open(os.devnull, "w")
            sys.exit(1)
        except OSError as err:  # an unwritable output folder, a full disk: the user's to fix
            where = f"{err.filename}: " if err.filename else ""
            click.echo(f"error: {_one_line(f'{where}{err.strerror or err}')}", err=True)
            sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dflash-gguf")
@click.option("-v", "--verbose", is_flag=True, help="Log progress details to stderr.")
def main(verbose: bool) -> None:
    """DFlash / DFlash 2 drafters: Hugging Face checkpoint to llama.cpp GGUF, run and validated.

    \b
    Typical flow:
      dflash-gguf convert DRAFTER_DIR --target TARGET.gguf -o drafter.gguf
      dflash-gguf inspect drafter.gguf
      dflash-gguf llama build
      dflash-gguf tune --target TARGET.gguf --draft drafter.gguf    # optional
      dflash-gguf serve --target TARGET.gguf --draft drafter.gguf
      dflash-gguf train --target TARGET.gguf --prompts chats.jsonl -o DRAFTER_DIR   # a drafter of your own
    """
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    filter_log_handlers()


def _register() -> None:
    # Each package owns its commands; this file only gathers them.
    groups = (convert_commands, llama_commands, serve_commands, watch_commands, tune_commands, validate_commands,
              doctor_commands, bench_commands, quantize_commands, release_commands, train_commands)
    for command in [c for group in groups for c in group]:
        main.add_command(command)


_register()


if __name__ == "__main__":
    main()
