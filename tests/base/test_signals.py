"""Signals reach the real llama-server commands (issue 14, class 7): `validate` and `generate` stop
within seconds on SIGTERM, SIGHUP or Ctrl-C, with 128+N, leaving no server process and no log."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def _server_pids(model: Path) -> set[int]:
    pids = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"llama-server") and str(model).encode() in cmd:
                pids.add(int(proc.name))
    return pids


@pytest.mark.parametrize("command, sig, status", [
    ("validate", signal.SIGTERM, 143), ("validate", signal.SIGINT, 130), ("generate", signal.SIGHUP, 129),
])
def test_runner_commands_stop_cleanly_on_signals(command, sig, status, converted, target_gguf, llama_bin, tmp_path):
    target = tmp_path / "target.gguf"
    shutil.copyfile(target_gguf, target)  # its own path: the servers of this test are found by it
    args = {"validate": ["validate", "-t", target, "-d", converted["dflash-b16"], "-n", "4096", "--parallel", "4"],
            "generate": ["generate", "-t", target, "-d", converted["dflash-b16"], "-n", "16384", "hello"]}[command]
    env = {**os.environ, "TMPDIR": str(tmp_path), "DFLASH_GGUF_TEST_LLAMA_BIN": str(llama_bin)}
    # a suite started in the background (`make test &`) inherits SIGINT ignored, and Python keeps it so
    proc = subprocess.Popen([sys.executable, "-m", "dflash_gguf.cli", *map(str, args), "--backend", "cpu"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not _server_pids(target) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()
    time.sleep(1.0)  # requests in flight
    servers = _server_pids(target)
    proc.send_signal(sig)
    started = time.monotonic()
    _, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - started < 15, "stopping took too long"
    assert proc.returncode == status, stderr
    assert "Traceback" not in stderr, stderr
    time.sleep(0.5)
    assert not [pid for pid in servers if _alive(pid)], "a llama-server outlived the command"
    assert not list(tmp_path.glob("llama-server-*.log")), "a temporary server log was left behind"


def test_quantize_cleans_up_on_sigterm(fixtures, target_gguf, llama_bin, tmp_path):
    from dflash_gguf.convert.converter import convert
    from tests.malformed import sparse_checkpoint

    ckpt = tmp_path / "ckpt"
    shutil.copytree(fixtures / "dflash-b16", ckpt)
    sparse_checkpoint(ckpt, 1 << 18)
    big = tmp_path / "big-F16.gguf"
    convert(ckpt, target_gguf, big, "f16")
    out = tmp_path / "q.gguf"
    proc = subprocess.Popen([sys.executable, "-m", "dflash_gguf.cli", "quantize", big, out, "--type", "Q4_K_M",
                             "--llama-bin", llama_bin, "--quantize-threads", "1"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".q.gguf.*.partial")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "llama-quantize finished before it could be interrupted"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 143, stderr
    assert not out.exists() and not list(tmp_path.glob(".q.gguf*")), "a partial output was left behind"
