"""huggingface_hub's own files, and what a server announces, never trusted across runs (issue 49).

- The agent registry (`$HF_HOME/.agent_harnesses.json`), read and rewritten by huggingface_hub
  whenever telemetry is on (its default): never opened, written or fetched (hub/transport.no_side_files).
- A file whose body differs from the size the Hub announced (its listing, its HEAD) is never stored
  in the cache, so a rerun against an honest Hub is not poisoned by what a hostile one sent once.
- A body is bounded by what was announced for the file, not by a fixed cap: the first byte beyond it
  ends the command in one line naming the file.

Every case runs the real command line against tests/local_hub.py, with telemetry left at
huggingface_hub's default (hub_env switches it off: these tests put it back).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.local_hub import Blob, LocalHub, hub_env, raw
from tests.warm import run_cli

REPO = "z-lab/tiny-dflash"


def _env(hub: LocalHub, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = hub_env(hub, tmp_path, **{"DFLASH_GGUF_HUB_TIMEOUT": "5", **extra})
    for name in ("HF_HUB_DISABLE_TELEMETRY", "DISABLE_TELEMETRY", "DO_NOT_TRACK"):
        env.pop(name, None)  # huggingface_hub's default: telemetry on
    return env


def _convert(hub, tmp_path, target_gguf, timeout: float = 60, **extra):
    out = tmp_path / "out.gguf"
    start = time.monotonic()
    proc = run_cli(["convert", REPO, "-t", target_gguf, "-o", out], env=_env(hub, tmp_path, **extra),
                   timeout=timeout)
    return proc, time.monotonic() - start, out


def _one_line(proc, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.startswith("error: ") and proc.stderr.strip().count("\n") == 0, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def _blobs(tmp_path: Path) -> list[Path]:
    return [p for p in (tmp_path / "hf-home" / "hub").rglob("blobs/*") if p.is_file()]


# -- the agent registry -----------------------------------------------------------------------------------

def test_the_agent_registry_is_never_read_written_or_fetched(hub, fixtures, target_gguf, tmp_path):
    hub.add_folder(REPO, fixtures / "dflash-b16")
    registry = tmp_path / "hf-home" / ".agent_harnesses.json"
    proc, _, out = _convert(hub, tmp_path, target_gguf)
    assert proc.returncode == 0, proc.stderr
    assert not any(c["path"].endswith("agent-harnesses") for c in hub.calls), [c["path"] for c in hub.calls]
    assert not registry.exists()

    # a FIFO there (nothing will ever write to it): an open would block every command, offline too
    os.mkfifo(registry)
    out.unlink()
    proc, took, out = _convert(hub, tmp_path, target_gguf, timeout=30, HF_HUB_OFFLINE="1")
    assert proc.returncode == 0, proc.stderr
    assert took < 20 and out.is_file()


# -- a blob unlike what the Hub announced is never stored -------------------------------------------------

def test_an_empty_answer_is_not_cached_and_the_honest_rerun_succeeds(hub, fixtures, target_gguf, tmp_path):
    sha = hub.add_folder(REPO, fixtures / "dflash-b16")
    config = (fixtures / "dflash-b16" / "config.json").read_bytes()
    # the file's own ETag (its git oid) and commit, but no bytes: Content-Length 0, HEAD and GET alike
    hub.answer(rf"/{REPO}/resolve/[^/]+/config\.json",
               raw(200, b"", {"X-Repo-Commit": sha, "ETag": f'"{Blob(config).git_oid}"'}))
    proc, _, out = _convert(hub, tmp_path, target_gguf)
    _one_line(proc, "config.json")
    assert not out.exists()
    assert not [p for p in _blobs(tmp_path) if p.stat().st_size == 0], "an empty blob was cached"

    hub.hostile.clear()
    proc, _, out = _convert(hub, tmp_path, target_gguf)
    assert proc.returncode == 0, proc.stderr
    assert out.is_file()


# -- bodies bounded by what was announced -----------------------------------------------------------------

def _announcing(size: int, body: bytes, sha: str, etag: str, endless: bool = False):
    """A file answer that announces `size` bytes (HEAD and GET) and sends `body`, then, `endless`, more
    bytes without end (chunked, no length) until the client hangs up."""
    def fn(handler) -> None:
        handler.send_response(200)
        handler.send_header("X-Repo-Commit", sha)
        handler.send_header("ETag", f'"{etag}"')
        handler.send_header("Content-Type", "application/json")
        if endless:
            handler.send_header("Transfer-Encoding", "chunked")
        else:
            handler.send_header("Content-Length", str(size))
        handler.end_headers()
        if handler.command == "HEAD":
            return
        handler.close_connection = True
        try:
            if endless:
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(body), body))
                while not handler.hub.closing.is_set():
                    handler.wfile.write(b"10000\r\n" + b" " * 0x10000 + b"\r\n")
            else:
                handler.wfile.write(body)
                handler.hub.closing.wait(30)
        except OSError:
            pass
    return fn


@pytest.mark.parametrize("endless", [False, True], ids=["announces-10-GB", "never-ends"])
def test_a_body_beyond_what_was_announced_is_refused(hub, fixtures, target_gguf, tmp_path, endless):
    sha = hub.add_folder(REPO, fixtures / "dflash-b16")
    config = (fixtures / "dflash-b16" / "config.json").read_bytes()
    hub.answer(rf"/{REPO}/resolve/[^/]+/config\.json",
               _announcing(10 * 10**9, config, sha, Blob(config).git_oid, endless))
    proc, took, out = _convert(hub, tmp_path, target_gguf, DFLASH_GGUF_HUB_TIMEOUT="30")
    _one_line(proc, "config.json", str(len(config)))
    assert took < 20, took
    assert not out.exists()
    assert all(p.stat().st_size <= len(config) for p in _blobs(tmp_path))
    hub.hostile.clear()
    proc, _, out = _convert(hub, tmp_path, target_gguf)
    assert proc.returncode == 0, proc.stderr
