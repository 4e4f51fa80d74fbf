"""Progress of long steps (dflash_gguf/progress.py, issue 48 item 5): plain lines in a log, one line
rewritten in place on a terminal, a heartbeat after a silence, nothing on stdout, no thread left.

Each case runs a short script in a fresh interpreter whose stderr is a pipe or a pseudo-terminal, as a
user's command would run."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[2]

PRELUDE = """
import sys, threading, time
from dflash_gguf.progress import printer, stage, working
p = printer()
"""


def _run(body: str, tty: bool = False) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of the script, stderr a pipe or the slave of a pseudo-terminal."""
    script = PRELUDE + textwrap.dedent(body)
    if not tty:
        proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
        return proc.returncode, proc.stdout, proc.stderr
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
        chunks = []
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the slave closed: EIO on Linux
                break
            if not chunk:
                break
            chunks.append(chunk)
        out = proc.stdout.read().decode()
        code = proc.wait(timeout=60)
    finally:
        os.close(master)
    return code, out, b"".join(chunks).decode()


def test_plain_lines_when_stderr_is_not_a_terminal():
    code, out, err = _run("""
        with stage(p, "validate: speculative server", total=3, every=0) as s:
            for _ in range(3):
                s.advance()
    """)
    assert code == 0 and out == ""
    lines = err.splitlines()
    assert [re.sub(r" \(\d+ s\)$", "", line) for line in lines] == [
        f"validate: speculative server: {n}/3" for n in (1, 2, 3)], err
    assert "\r" not in err and "\x1b" not in err


def test_quick_units_print_at_most_one_line_per_interval_and_always_the_last():
    code, out, err = _run("""
        with stage(p, "replay", total=50, every=0.2) as s:
            for _ in range(50):
                time.sleep(0.02)
                s.advance()
    """)
    lines = err.splitlines()
    assert code == 0 and out == "" and 2 <= len(lines) <= 8, err
    assert lines[-1].startswith("replay: 50/50 ("), err


def test_a_terminal_gets_one_line_rewritten_in_place():
    code, out, err = _run("""
        with stage(p, "speed", total=3, every=0, unit="requests") as s:
            for _ in range(3):
                s.advance()
        p("after")
    """, tty=True)
    assert code == 0 and out == ""
    assert "\rspeed: 3/3 requests (0 s)\x1b[K" in err, repr(err)
    # every count rewrote the one line: a single newline ends it, then the next line
    assert err.replace("\r\n", "\n").count("\n") == 2 and err.rstrip().endswith("after"), repr(err)


def test_a_heartbeat_after_a_silence_and_no_thread_after_the_block():
    code, out, err = _run("""
        with working(p, "llama build: compiling", beat=0.3):
            time.sleep(1.0)
        print(threading.active_count(), file=sys.stderr)
        time.sleep(0.8)  # no beat after the block
    """)
    lines = err.splitlines()
    assert code == 0 and out == ""
    beats = [line for line in lines if line.startswith("llama build: compiling: still working (")]
    assert 2 <= len(beats) <= 4 and lines[-1] == "1", err


def test_output_in_the_stage_holds_the_heartbeat_off():
    code, out, err = _run("""
        with working(p, "teacher", beat=0.5):
            for i in range(8):
                p(f"line {i}")
                time.sleep(0.15)
    """)
    assert code == 0 and "still working" not in err, err


def test_the_thread_stops_on_an_exception_and_on_ctrl_c_and_the_error_passes():
    code, out, err = _run("""
        for error in (ValueError("bad"), KeyboardInterrupt()):
            try:
                with stage(p, "bench", total=4, beat=0.1) as s:
                    s.advance()
                    raise error
            except (ValueError, KeyboardInterrupt) as caught:
                print(type(caught).__name__, threading.active_count(), file=sys.stderr)
        time.sleep(0.4)
    """)
    assert code == 0 and out == ""
    assert err.splitlines() == ["ValueError 1", "KeyboardInterrupt 1"], err


def test_names_from_files_are_shown_escaped():
    code, _, err = _run(r"""
        with stage(p, "validate evil\x1b[2Jname", total=1, every=0) as s:
            s.advance()
    """)
    assert code == 0 and "\x1b" not in err and "evil\\x1b[2Jname" in err, repr(err)


def test_validate_on_the_trained_pair_is_never_30_s_silent(trained_pair, tmp_path):
    """End to end: benchmarks/silence.py over a real validate (one thread, so the lead's timings keep
    their cores) fails at a 30 s gap; the report on stdout stays JSON."""
    report = tmp_path / "report.json"
    cmd = ["nice", sys.executable, "-m", "dflash_gguf.cli", "validate", "--target", trained_pair["target"],
           "--draft", trained_pair["dflash"], "--prompts", trained_pair["prompts"], "--threads", "1",
           "--report", str(report), "--json"]
    proc = subprocess.run([sys.executable, "-m", "benchmarks.silence", "--limit", "30", "--", *cmd], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "never 30 s silent" in proc.stderr
    assert json.loads(report.read_text())["lossless"] is True
