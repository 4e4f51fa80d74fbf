"""The longest silences of a command: run it, pass its output through as it comes, time every line,
and say where it went quiet longest (issue 48: a newcomer's `make demo` never shows a silent minute).

    python -m benchmarks.silence [--limit 60] -- make demo

stdout and stderr are read together as the user's terminal shows them (not a terminal: the command's
plain progress lines). At the end, on stderr: the total time, the five longest gaps with the line
that ended each, and whether any gap reached --limit seconds; exit 1 if one did, else the command's
own exit status.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=float, default=60.0, help="seconds of silence that count as a failure")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    start = last = time.monotonic()
    gaps: list[tuple[float, float, str]] = []  # (gap, at, line that ended it)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0) as proc:
        pending = b""
        while chunk := os.read(proc.stdout.fileno(), 65536):
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
            now = time.monotonic()
            *lines, pending = re.split(rb"[\r\n]", pending + chunk)  # a progress bar rewrites its line with \r
            for line in (line for line in lines if line.strip()):
                gaps.append((now - last, now - start, line.decode(errors="replace")))
                last = now
    end = time.monotonic()
    gaps.append((end - last, end - start, "(the command ended)"))
    longest = sorted(gaps, reverse=True)[:5]
    print(f"\nsilence: {end - start:.0f} s in all, {len(gaps) - 1} lines; the longest gaps:", file=sys.stderr)
    for gap, at, line in longest:
        print(f"  {gap:6.1f} s, ended at {at:6.0f} s by: {line[:120]}", file=sys.stderr)
    worst = longest[0][0]
    over = worst >= args.limit
    print(f"silence: longest {worst:.1f} s: {'a silent stretch of ' + str(int(args.limit)) + ' s or more' if over else 'never ' + str(int(args.limit)) + ' s silent'}",
          file=sys.stderr)
    return 1 if over else proc.returncode


if __name__ == "__main__":
    sys.exit(main())
