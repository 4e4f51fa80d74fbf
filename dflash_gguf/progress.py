"""Progress of the long steps (issue 48): never a silent minute, never a byte on stdout.

The library reports through a `Progress` callback (one line of text); the command line passes
`printer()`, which writes each line to stderr with names from files shown escaped. A step that
repeats a unit (prompts answered, speed requests, training steps) opens a `stage`:

    with stage(progress, "validate: speculative server", total=16) as s:
        for prompt in prompts:
            ...
            s.advance()

On a terminal the printer rewrites one line in place ("validate: speculative server 3/16, 41 s");
elsewhere (a log, `make demo`'s captured stderr) it prints plain lines: one per unit, at most one per
`every` seconds when units are quick, and the last count once it printed any (a stage quicker than
`every` adds no line). A step with nothing to count opens
`working(progress, "what")`. While either is open a daemon thread prints "<what>: still working (N s)"
whenever nothing was printed for `beat` seconds (20 s: under the 30 s that benchmarks/silence.py
counts as a silent stretch in tests). The thread stops when the block ends, also on an exception or
Ctrl-C.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import click

from .terminal import shown

Progress = Callable[[str], None]

BEAT = 20.0  # seconds of quiet before a heartbeat line
EVERY = 10.0  # at most one plain line per this many seconds for quick units


class Printer:
    """The default progress sink: lines on stderr. `status` rewrites the current line in place on a
    terminal and is a plain line elsewhere. Every write is under one lock (heartbeat threads print too)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._open = False  # a status line is on screen without its newline
        self.last = time.monotonic()  # when anything was last written

    @staticmethod
    def tty() -> bool:
        return sys.stderr.isatty()

    def __call__(self, message: str) -> None:
        with self._lock:
            self._end_status()
            click.echo(shown(message), err=True)
            self.last = time.monotonic()

    def status(self, message: str) -> None:
        if not self.tty():
            self(message)
            return
        with self._lock:
            width = shutil.get_terminal_size((100, 24)).columns - 1  # a wrapped line cannot be rewritten
            click.echo(f"\r{shown(message)[:width]}\033[K", err=True, nl=False)
            self._open = True
            self.last = time.monotonic()

    def end_status(self) -> None:
        with self._lock:
            self._end_status()

    def _end_status(self) -> None:
        if self._open:
            click.echo("", err=True)
            self._open = False


_PRINTER = Printer()


def printer() -> Printer:
    """The process's one stderr printer (one, so that a heartbeat knows when anything was printed)."""
    return _PRINTER


def _seconds(s: float) -> str:
    s = int(s)
    return f"{s} s" if s < 120 else f"{s // 60} min {s % 60:02d} s"


class Stage:
    """A step in progress: counted with `advance`, watched by a heartbeat (see the module's docstring)."""

    def __init__(self, progress: Progress | None, what: str, total: int | None = None, *, every: float = EVERY,
                 beat: float = BEAT, unit: str = "") -> None:
        self.progress = progress or (lambda _message: None)
        self.printer = progress if isinstance(progress, Printer) else None
        self.what, self.total, self.every, self.beat, self.unit = what, total, every, beat, unit
        self.done = 0
        self.note = ""
        self.started = self._said = time.monotonic()
        self._shown = 0  # the count last printed as a plain line
        self._spoke = False  # a plain line was printed: a stage quicker than `every` prints none
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # the line
    def line(self) -> str:
        count = f"{self.done}/{self.total}" if self.total is not None else f"{self.done}"
        unit = f" {self.unit}" if self.unit else ""
        note = f", {self.note}" if self.note else ""
        return f"{self.what}: {count}{unit}{note} ({_seconds(time.monotonic() - self.started)})"

    def _counted(self) -> bool:
        return self.total is not None or self.done > 0

    def _in_place(self) -> bool:
        return self.printer is not None and self.printer.tty()

    def advance(self, n: int = 1, note: str | None = None) -> None:
        """`n` more units done; `note` (a loss, a rate) is shown after the count until replaced."""
        with self._lock:
            self.done += n
            if note is not None:
                self.note = note
            now = time.monotonic()
            last = self.total is not None and self.done >= self.total
            if self._in_place():
                self.printer.status(self.line())
            elif (last and self._spoke) or now - self._said >= self.every:
                self.progress(self.line())
                self._shown, self._spoke = self.done, True
            else:
                return
            self._said = now

    def say(self, message: str) -> None:
        """A line of its own inside the stage (the counted line resumes at the next advance)."""
        with self._lock:
            self.progress(message)
            self._said = time.monotonic()

    # the heartbeat
    def _quiet_since(self) -> float:
        return max(self._said, self.printer.last if self.printer else 0.0, _PRINTER.last)

    def _beat(self) -> None:
        while not self._stop.wait(max(0.05, min(self.beat, self._quiet_since() + self.beat - time.monotonic()))):
            with self._lock:
                now = time.monotonic()
                if now - self._quiet_since() < self.beat:
                    continue
                message = f"{self.what}: still working ({_seconds(now - self.started)})"
                if self._in_place():
                    self.printer.status(self.line() if self._counted() else message)
                else:
                    self.progress(message)
                    self._spoke = True
                self._said = now

    def __enter__(self) -> Stage:
        if self._in_place() and self._counted():
            self.printer.status(self.line())
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat: {self.what}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind, _value, _tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self._in_place():
                self.printer.end_status()
            elif kind is None and self._spoke and self.done != self._shown:
                self.progress(self.line())  # once it spoke, the last count is always printed


def stage(progress: Progress | None, what: str, total: int | None = None, **kwargs) -> Stage:
    return Stage(progress, what, total, **kwargs)


@contextmanager
def working(progress: Progress | None, what: str, *, beat: float = BEAT) -> Iterator[Stage]:
    """An uncounted step: only the heartbeat."""
    with Stage(progress, what, beat=beat) as s:
        yield s
