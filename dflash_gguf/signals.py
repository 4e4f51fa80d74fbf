"""Terminating signals: every command cleans up and stops with a status that says which signal.

While a command runs, SIGTERM and SIGHUP raise `Terminated` in the main thread, as SIGINT raises
KeyboardInterrupt, so the same `finally` blocks that remove `.partial` files and stop servers on
Ctrl-C run for them too. The exit status is 128 + the signal's number (130 for SIGINT, 143 for
SIGTERM, 129 for SIGHUP): distinct from 1 ("mismatch", "problems found") and 2 (bad input).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


class Terminated(KeyboardInterrupt):
    """The process got SIGTERM or SIGHUP; args[0] is the signal's name."""


_HANDLED = ("SIGTERM", "SIGHUP")
# Called when SIGINT, SIGTERM or SIGHUP arrives, before the exception is raised: what the main thread's
# exception cannot reach (a download in a worker thread, which the main thread waits for) is told to
# stop here.
_ON_TERMINATE: list = []


def on_terminate(hook) -> None:
    """Call `hook()` (once registered, at every SIGINT, SIGTERM or SIGHUP) before the command unwinds."""
    if hook not in _ON_TERMINATE:
        _ON_TERMINATE.append(hook)


@contextlib.contextmanager
def raise_on_terminate(*, sigint: bool = False) -> Iterator[None]:
    """SIGTERM and SIGHUP raise `Terminated` while the block runs, and SIGINT KeyboardInterrupt, each
    after the `on_terminate` hooks. SIGINT is left ignored where the shell started us with it ignored
    (as for `cmd &`), unless `sigint`."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, _frame):
        for hook in _ON_TERMINATE:
            hook()
        raise Terminated(signal.Signals(signum).name)

    def interrupt(_signum, _frame):
        for hook in _ON_TERMINATE:
            hook()
        raise KeyboardInterrupt("SIGINT")

    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    handlers = [(name, terminate) for name in _HANDLED] + ([("SIGINT", interrupt)] if sigint or not ignored else [])
    previous = {}
    for name, function in handlers:
        if hasattr(signal, name):
            sig = getattr(signal, name)
            previous[sig] = signal.signal(sig, function)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def exit_status(stop: KeyboardInterrupt) -> int:
    """128 + the number of the signal that stopped us (a KeyboardInterrupt naming none is SIGINT)."""
    name = stop.args[0] if stop.args and isinstance(stop.args[0], str) else "SIGINT"
    try:
        return 128 + int(signal.Signals[name])
    except KeyError:
        return 128 + int(signal.SIGINT)


def signal_name(status: int) -> str:
    try:
        return signal.Signals(status - 128).name
    except ValueError:
        return f"signal {status - 128}"
