"""A hostile Hub and a hostile cache (issue 35, the Hub side): nothing lost, nothing leaked, nothing
hangs, no traceback, against tests/local_hub.py on 127.0.0.1 (its CDN, another port, is "another host").

Every case runs the real command line; a hang is bounded by a short DFLASH_GGUF_HUB_TIMEOUT, so a
test that fails by hanging fails in seconds (subprocess timeout), not never.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.local_hub import Blob, LocalHub, drip, hang, hub_env, model_info, raw
from tests.warm import run_cli

TOKEN = "hf_HostileHubToken0123456789abcdef"
DRAFTER = "z-lab/d"
INFO = r"/api/models/z-lab/d(/revision/.*)?"
CONFIG = json.dumps({"architectures": ["DFlashDraftModel"], "model_type": "qwen3"})


def _repo(hub: LocalHub, **files) -> str:
    return hub.add_commit(DRAFTER, {"config.json": CONFIG, "README.md": "---\nlicense: mit\n---\n", **files})


def _run(hub: LocalHub, tmp_path: Path, *args, timeout: float = 60, **env) -> tuple[subprocess.CompletedProcess, float]:
    env = hub_env(hub, tmp_path, **{"DFLASH_GGUF_HUB_TIMEOUT": "1", **env})
    start = time.monotonic()
    proc = run_cli(args, env=env, timeout=timeout)
    return proc, time.monotonic() - start


def _convert(hub, tmp_path, *extra, **env):
    return _run(hub, tmp_path, *extra, "convert", DRAFTER, "-t", "z-lab/t", "-o", tmp_path / "out.gguf", **env)


def _one_line(proc, *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.startswith("error: ") and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr
    return proc.stderr


def _outside_cache(tmp_path: Path) -> set[str]:
    """Everything under tmp_path but the cache (HF_HOME) itself."""
    home = tmp_path / "hf-home"
    return {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if home not in (p, *p.parents)}


# -- model info and identifiers: checked before huggingface_hub makes paths of them --------------------

@pytest.mark.parametrize("changes, needle", [
    ({"sha": "../../../../victim.txt"}, "is not a commit id"),
    ({"sha": "../../../../made-dir"}, "is not a commit id"),
    ({"sha": TOKEN}, "is not a commit id"),
    ({"sha": "a" * 40 + "\n"}, "is not a commit id"),
    ({"sha": None}, "is not a commit id"),
    ({"id": None, "modelId": None}, "no repository id"),
    ({"siblings": "config.json"}, "'siblings' is not a list"),
    ({"siblings": [1, 2]}, "siblings[0] is not an object"),
    ({"siblings": [{"rfilename": "../../../../victim.txt"}]}, "leaves the folder"),
])
def test_malformed_model_info_is_one_line_and_writes_nothing_outside(hub, tmp_path, changes, needle):
    _repo(hub)
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file\n")
    before = _outside_cache(tmp_path)
    hub.answer(INFO, raw(200, model_info(hub, DRAFTER, **changes)))
    proc, _ = _convert(hub, tmp_path, HF_TOKEN=TOKEN)
    stderr = _one_line(proc, needle)
    assert TOKEN not in stderr + proc.stdout
    assert victim.read_text() == "the user's own file\n"
    assert _outside_cache(tmp_path) == before
    cache = tmp_path / "hf-home"
    assert not any(TOKEN in str(p) for p in cache.rglob("*"))  # no secret as a file or folder name


@pytest.mark.parametrize("body, needle", [
    (b"[1, 2]", "not a JSON object"),
    (b"<html>not json</html>", "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
])
def test_model_info_that_is_not_an_object_is_one_line(hub, tmp_path, body, needle):
    _repo(hub)
    hub.answer(INFO, raw(200, body))
    _one_line(_convert(hub, tmp_path)[0], needle)


@pytest.mark.parametrize("header, value", [
    ("X-Repo-Commit", "../../../../victim"),
    ("ETag", '"../../../../victim"'),
    ("ETag", f'"{TOKEN}"'),
])
def test_file_headers_that_would_be_paths_are_refused(hub, tmp_path, header, value):
    sha = _repo(hub)
    headers = {"X-Repo-Commit": sha, "ETag": '"' + "e" * 40 + '"', header: value}
    hub.answer(r"/z-lab/d/resolve/.*", raw(200, CONFIG.encode(), headers))
    before = _outside_cache(tmp_path)
    proc, _ = _convert(hub, tmp_path, HF_TOKEN=TOKEN)
    _one_line(proc, header)
    assert _outside_cache(tmp_path) == before
    assert not any(TOKEN in str(p) or ".." in p.name for p in (tmp_path / "hf-home").rglob("*"))


def test_a_file_announced_in_xet_storage_comes_over_the_guarded_http(hub, tmp_path):
    """hf_xet would fetch it with its own client from a host the server names: the guard never sees it."""
    sha = _repo(hub)
    headers = {"X-Repo-Commit": sha, "ETag": '"' + "e" * 40 + '"', "X-Xet-Hash": "a" * 64,
               "X-Xet-Refresh-Route": f"{hub.cdn_url}/api/models/z-lab/d/xet-read-token/{sha}"}
    hub.answer(r"/z-lab/d/resolve/[^/]+/config.json", raw(200, CONFIG.encode(), headers))
    proc, _ = _convert(hub, tmp_path, HF_TOKEN=TOKEN)
    got = [c for c in hub.calls if c["path"].endswith("/config.json") and c["method"] == "GET"]
    assert got, proc.stderr
    assert not any("xet" in c["path"] for c in hub.calls), [c["path"] for c in hub.calls]
    assert TOKEN not in proc.stderr + proc.stdout


# -- the token goes to the endpoint's origin only -------------------------------------------------------

def test_next_page_link_to_another_host_gets_no_token(hub, tmp_path):
    _repo(hub)
    page = json.dumps([{"type": "file", "path": "config.json", "size": len(CONFIG), "oid": "c" * 40}]).encode()
    hub.answer(r"/api/models/z-lab/d/tree/[0-9a-f]{40}", raw(200, page, {
        "Link": f'<{hub.cdn_url}/api/models/z-lab/d/tree/main?cursor=2>; rel="next"'}))
    proc, _ = _convert(hub, tmp_path, HF_TOKEN=TOKEN)
    assert TOKEN not in proc.stderr + proc.stdout
    elsewhere = [c for c in hub.calls if c["cdn"]]
    assert elsewhere, "the next page was not asked for: the test proves nothing"
    assert not any("authorization" in c["headers"] for c in elsewhere)
    assert all(c["headers"].get("authorization") == f"Bearer {TOKEN}" for c in hub.calls if not c["cdn"])


def test_next_page_link_to_itself_stops(hub, tmp_path):
    _repo(hub)
    hub.answer(r"/api/models/z-lab/d/tree/.*", raw(200, b"[]", {
        "Link": f'<{hub.url}/api/models/z-lab/d/tree/main?recursive=true&cursor=x>; rel="next"'}))
    proc, took = _convert(hub, tmp_path)
    _one_line(proc, "next-page link leads back")
    assert took < 30


# -- hangs: every request ends within its deadline, and on SIGTERM ----------------------------------------

def _slow(data: bytes, every_s: float = 0.2):
    """The file's own bytes, one every `every_s` seconds, under its true size (a HEAD answered as the Hub
    does): a download that is slow, not one that announces what the file is not."""
    def fn(handler) -> None:
        if handler.command == "HEAD":
            return handler._route_get()
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.close_connection = True
        try:
            for byte in data:
                handler.wfile.write(bytes([byte]))
                handler.wfile.flush()
                if handler.hub.closing.wait(every_s):
                    return
        except OSError:
            pass
    return fn


@pytest.mark.parametrize("answer", [hang, drip(headers_too=True), _slow(CONFIG.encode())],
                         ids=["never-answers", "drips-headers", "drips-body"])
def test_a_server_that_never_finishes_ends_within_the_deadline(hub, tmp_path, answer):
    _repo(hub)
    hub.answer(r"/z-lab/d/resolve/.*/config\.json", answer)
    proc, took = _convert(hub, tmp_path)
    _one_line(proc, "no complete answer within 1 s", "DFLASH_GGUF_HUB_TIMEOUT")
    assert took < 20, took


def test_model_info_that_never_answers_ends(hub, tmp_path):
    _repo(hub)
    hub.answer(INFO, hang)
    proc, took = _run(hub, tmp_path, "release", DRAFTER, "-t", "z-lab/t", "--types", "F16", "--push", "me/x",
                      HF_TOKEN=TOKEN)
    _one_line(proc, "no complete answer")
    assert took < 20, took


def test_sigterm_ends_a_hung_download(hub, tmp_path):
    _repo(hub)
    hub.answer(r"/z-lab/d/resolve/.*/config\.json", _slow(CONFIG.encode()))
    env = hub_env(hub, tmp_path, DFLASH_GGUF_HUB_TIMEOUT="600")
    proc = subprocess.Popen([sys.executable, "-m", "dflash_gguf.cli", "convert", DRAFTER, "-t", "z-lab/t", "-o",
                             tmp_path / "out.gguf"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not any(c["path"].endswith("/config.json") for c in hub.calls):
            assert time.monotonic() < deadline and proc.poll() is None, "the download never started"
            time.sleep(0.1)
        time.sleep(0.5)  # well inside the (worker thread's) download
        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        _, stderr = proc.communicate(timeout=15)
        assert time.monotonic() - start < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr
    assert not (tmp_path / "out.gguf").exists()


def _start_convert(hub, tmp_path, target, **env) -> subprocess.Popen:
    """The command line as a user starts it: SIGINT as a terminal delivers it (not ignored, as a suite
    started with `make test &` would have it)."""
    env = hub_env(hub, tmp_path, **env)
    return subprocess.Popen([sys.executable, "-m", "dflash_gguf.cli", "convert", "z-lab/tiny-dflash", "-t", target,
                             "-o", tmp_path / "out.gguf"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _stop(proc: subprocess.Popen, sig: int, started) -> tuple[str, float]:
    """Wait until `started()`, send `sig`; (stderr, seconds the command took to end)."""
    try:
        deadline = time.monotonic() + 30
        while not started():
            assert time.monotonic() < deadline and proc.poll() is None, "the command never got there"
            time.sleep(0.05)
        time.sleep(0.5)
        proc.send_signal(sig)
        start = time.monotonic()
        _, stderr = proc.communicate(timeout=30)
        return stderr, time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ctrl_c_ends_a_hub_download_at_once_and_the_rerun_succeeds(hub, fixtures, target_gguf, tmp_path):
    hub.add_folder("z-lab/tiny-dflash", fixtures / "dflash-b16")
    # the weights, from the CDN, as announced, a byte at a time
    hub.answer(r"/_lfs/.*", _slow((fixtures / "dflash-b16" / "model.safetensors").read_bytes()))
    proc = _start_convert(hub, tmp_path, target_gguf, DFLASH_GGUF_HUB_TIMEOUT="600")
    stderr, took = _stop(proc, signal.SIGINT, lambda: any(c["path"].startswith("/_lfs/") for c in hub.calls))
    assert proc.returncode == 130, stderr
    assert took < 1, took
    assert "Traceback" not in stderr
    assert not (tmp_path / "out.gguf").exists()
    assert not list((tmp_path / "hf-home").rglob("*.incomplete")), "a partial download was left"
    hub.hostile.clear()
    proc, _ = _run(hub, tmp_path, "convert", "z-lab/tiny-dflash", "-t", target_gguf, "-o", tmp_path / "out.gguf")
    assert proc.returncode == 0, proc.stderr


def test_sigterm_ends_a_connect_that_never_completes(hub, fixtures, target_gguf, tmp_path):
    """The weights' CDN: a listening socket whose backlog is full, so that a connect to it waits forever
    (in huggingface_hub's download thread, which no signal reaches)."""
    sha = hub.add_folder("z-lab/tiny-dflash", fixtures / "dflash-b16")
    blackhole = socket.socket()
    blackhole.bind(("127.0.0.1", 0))
    blackhole.listen(0)
    port = blackhole.getsockname()[1]
    waiting = []
    for _ in range(4):
        waiting.append(socket.socket())
        waiting[-1].setblocking(False)
        waiting[-1].connect_ex(("127.0.0.1", port))
    weights = Blob((fixtures / "dflash-b16" / "model.safetensors").read_bytes())
    hub.answer(r"/z-lab/tiny-dflash/resolve/[^/]+/model\.safetensors", raw(302, b"", {
        "X-Repo-Commit": sha, "Location": f"http://127.0.0.1:{port}/_lfs/{weights.sha256}",
        "X-Linked-Size": weights.size, "X-Linked-Etag": f'"{weights.sha256}"', "ETag": f'"{weights.git_oid}"'}))
    try:
        proc = _start_convert(hub, tmp_path, target_gguf, DFLASH_GGUF_HUB_TIMEOUT="600")
        stderr, took = _stop(proc, signal.SIGTERM, lambda: any(c["path"].endswith("model.safetensors")
                                                               for c in hub.calls))
    finally:
        for s in (blackhole, *waiting):
            s.close()
    assert proc.returncode == 143, stderr
    assert took < 1, took
    assert "Traceback" not in stderr
    assert not (tmp_path / "out.gguf").exists()


@pytest.mark.parametrize("headers", [{"Retry-After": "3600"}, {}], ids=["retry-after-an-hour", "503-storm"])
def test_retries_are_capped(hub, tmp_path, headers):
    _repo(hub)
    hub.answer(r"/z-lab/d/resolve/.*", raw(503, b'{"error": "busy"}', headers))
    proc, took = _convert(hub, tmp_path)
    _one_line(proc, "503")
    assert took < 15, took  # huggingface_hub alone: 23 s of back-off, or the hour asked
    # RETRY_LIMIT for the command, plus what was in flight in huggingface_hub's other download threads
    # (alone it asks 6 times per file: 12)
    assert len([c for c in hub.calls if "/resolve/" in c["path"]]) <= 6


# -- bodies are bounded before they are read --------------------------------------------------------------

def test_a_gzip_bomb_is_not_decoded(hub, tmp_path):
    _repo(hub)
    bomb = gzip.compress(b" " * (64 << 20), 9)  # 64 MiB of spaces: a valid JSON prefix, over the API limit
    assert len(bomb) < 1 << 20
    hub.answer(INFO, raw(200, bomb, {"Content-Encoding": "gzip"}))
    _one_line(_convert(hub, tmp_path)[0], "MiB an API answer may be")
    # a file asked for as is, answered compressed: not decoded to disk
    hub.hostile.clear()
    sha = _repo(hub)
    hub.answer(r"/z-lab/d/resolve/.*/config\.json", raw(200, bomb, {
        "Content-Encoding": "gzip", "X-Repo-Commit": sha, "ETag": '"' + "e" * 40 + '"'}))
    _one_line(_convert(hub, tmp_path)[0], "encoded body where none was asked")
    assert all(p.stat().st_size < 1 << 20 for p in (tmp_path / "hf-home").rglob("*") if p.is_file())


# -- secrets: credentials in HF_ENDPOINT never reach an output, whatever logs them -----------------------

@pytest.mark.parametrize("extra, env", [((), {}), (("-v",), {}), (("-v",), {"HF_HUB_VERBOSITY": "debug"})],
                         ids=["plain", "verbose", "hf-debug"])
def test_endpoint_credentials_never_shown(hub, tmp_path, extra, env):
    _repo(hub)
    password = "EndpointPassw0rd-42"
    hub.answer(INFO, raw(503, json.dumps({"error": f"denied for alice:{password}"}).encode(),
                         {"X-Error-Message": f"bad password {password}"}))
    endpoint = hub.url.replace("http://", f"http://alice:{password}@")
    proc, _ = _convert(hub, tmp_path, *extra, HF_ENDPOINT=endpoint, **env)
    assert proc.returncode == 2
    assert password not in proc.stderr + proc.stdout, proc.stderr
    assert "Traceback" not in proc.stderr


# -- the environment huggingface_hub parses ------------------------------------------------------------

@pytest.mark.parametrize("name, value, needle", [
    ("HF_HUB_ETAG_TIMEOUT", "abc", "HF_HUB_ETAG_TIMEOUT"),
    ("HF_ENDPOINT", "http://127.0.0.1:1\r\nX-Injected: 1", "HF_ENDPOINT"),
    ("HF_ENDPOINT", "ftp://127.0.0.1", "HF_ENDPOINT"),
    ("DFLASH_GGUF_HUB_TIMEOUT", "soon", "DFLASH_GGUF_HUB_TIMEOUT"),
])
def test_a_malformed_hub_setting_is_one_line(hub, tmp_path, name, value, needle):
    _repo(hub)
    _one_line(_convert(hub, tmp_path, **{name: value})[0], needle)
    assert hub.calls == []


# -- the cache: read confined, never blocking ---------------------------------------------------------

def _cached_repo(hub, tmp_path) -> tuple[Path, str]:
    """The drafter's files in the cache, as an online run leaves them; (its cache folder, the commit)."""
    sha = _repo(hub)
    _convert(hub, tmp_path)  # fails on the checkpoint itself, after the files came down
    storage = tmp_path / "hf-home" / "hub" / "models--z-lab--d"
    assert (storage / "refs" / "main").read_text() == sha
    return storage, sha


@pytest.mark.parametrize("what", ["refs/main", "trees"])
def test_a_fifo_in_the_cache_is_refused_not_read(hub, tmp_path, what):
    storage, sha = _cached_repo(hub, tmp_path)
    path = storage / "refs" / "main" if what == "refs/main" else storage / "trees" / f"{sha}.json"
    path.unlink(missing_ok=True)
    path.parent.mkdir(exist_ok=True)
    os.mkfifo(path)
    proc, took = _convert(hub, tmp_path, HF_HUB_OFFLINE="1", timeout=30)
    _one_line(proc, path.name, "not a regular file")
    assert took < 20


@pytest.mark.parametrize("listing", [
    b"[" * 200_000 + b"]" * 200_000,
    b'{"format_version": 1, "files": {"../x": {"size": 1, "blob_id": "a"}}}',
], ids=["nested-deep", "path-out"])
def test_an_unusable_cached_listing_is_one_line(hub, tmp_path, listing):
    storage, sha = _cached_repo(hub, tmp_path)
    tree = storage / "trees" / f"{sha}.json"
    tree.parent.mkdir(exist_ok=True)
    tree.write_bytes(listing)
    proc, _ = _convert(hub, tmp_path, HF_HUB_OFFLINE="1")
    _one_line(proc, str(tree), "cached file listing is unusable")


def test_a_ref_or_snapshot_leading_out_of_the_cache_is_refused(hub, tmp_path):
    storage, sha = _cached_repo(hub, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "README.md").write_text("---\nlicense: mit\n---\nSECRET-OUTSIDE\n")
    (elsewhere / "config.json").write_text(CONFIG)
    snapshot = storage / "snapshots" / sha
    os.rename(snapshot, tmp_path / "moved")
    snapshot.symlink_to(elsewhere, target_is_directory=True)
    proc, _ = _convert(hub, tmp_path, HF_HUB_OFFLINE="1")
    _one_line(proc, str(snapshot), "link")
    assert "SECRET-OUTSIDE" not in proc.stdout + proc.stderr

    snapshot.unlink()
    os.rename(tmp_path / "moved", snapshot)
    (storage / "refs" / "main").unlink()
    (storage / "refs" / "main").symlink_to(elsewhere / "README.md")
    _one_line(_convert(hub, tmp_path, HF_HUB_OFFLINE="1")[0], "main", "outside")


# -- publish: the LFS verify URL on another host gets no token ----------------------------------------

def test_an_lfs_verify_url_elsewhere_gets_no_token(hub, tmp_path):
    from tests.release.test_publish import _folder

    folder = _folder(tmp_path / "rel")
    hub.lfs_uploads = True
    proc, _ = _run(hub, tmp_path, "publish", folder, "--repo", "me/tiny", HF_TOKEN=TOKEN)
    assert proc.returncode == 0, proc.stderr
    sent = hub.store["me/tiny"].commits[hub.store["me/tiny"].refs["main"]]
    assert sent["dflash-Tiny-F16.gguf"].data == (folder / "dflash-Tiny-F16.gguf").read_bytes()
    verified = [c for c in hub.calls if c["path"] == "/_verify"]
    assert len(verified) == 2 and all(c["cdn"] for c in verified)
    assert not any("authorization" in c["headers"] for c in hub.calls if c["cdn"])
    assert TOKEN not in proc.stderr + proc.stdout


def test_a_command_s_hub_traffic_has_a_deadline_too(hub, tmp_path):
    """Pages each answered in time, without end: the command's own clock stops it (10 request deadlines)."""
    _repo(hub)

    def slow_page(handler):
        cursor = int(handler._call["query"].get("cursor", ["0"])[0])
        time.sleep(0.1)
        raw(200, b"[]", {"Link": f'<{hub.url}/api/models/z-lab/d/tree/main?recursive=true&cursor={cursor + 1}>; '
                                  'rel="next"'})(handler)

    hub.answer(r"/api/models/z-lab/d/tree/.*", slow_page)
    proc, took = _convert(hub, tmp_path, DFLASH_GGUF_HUB_TIMEOUT="0.3")
    _one_line(proc, "this command's Hub traffic has taken over 10 times 0.3 s")
    assert took < 30, took


# -- a target GGUF on the Hub: sizes a server claims, a cached file linked out -------------------------

def _gguf_repo(hub: LocalHub, tmp_path: Path) -> tuple[str, Path]:
    from tests.release.test_publish import tiny_gguf

    (tmp_path / "served").mkdir()
    gguf = tiny_gguf(tmp_path / "served" / "t-F16.gguf", 4)
    hub.add_commit("org/t-GGUF", {"t-F16.gguf": gguf})
    return hashlib.sha256(gguf.read_bytes()).hexdigest(), gguf


def test_a_range_answered_with_gigabytes_is_not_read(hub, fixtures, tmp_path):
    sha256, _ = _gguf_repo(hub, tmp_path)

    def huge(handler):
        handler.send_response(206)
        handler.send_header("Content-Length", str(3 << 30))
        handler.send_header("Content-Range", f"bytes 0-{(3 << 30) - 1}/{3 << 30}")
        handler.end_headers()
        handler.wfile.write(b"GGUF" + b"\0" * 4096)
        handler.close_connection = True

    hub.answer(rf"/_lfs/{sha256}", huge)
    proc, took = _run(hub, tmp_path, "convert", fixtures / "dflash-b16", "-t", "org/t-GGUF:F16", "-o",
                      tmp_path / "out.gguf")
    _one_line(proc, "answered a range of")
    assert not (tmp_path / "out.gguf").exists()


def test_a_cached_gguf_linked_out_of_the_cache_is_refused(hub, fixtures, tmp_path):
    _, gguf = _gguf_repo(hub, tmp_path)
    env = hub_env(hub, tmp_path)
    subprocess.run([sys.executable, "-c", "from huggingface_hub import hf_hub_download as d; "
                    "d('org/t-GGUF', 't-F16.gguf')"], env=env, check=True)
    (cached,) = (tmp_path / "hf-home" / "hub" / "models--org--t-GGUF" / "snapshots").glob("*/t-F16.gguf")
    cached.unlink()
    cached.symlink_to(gguf)  # a file of the user's, outside the cache
    for offline in ("0", "1"):
        proc, _ = _run(hub, tmp_path, "convert", fixtures / "dflash-b16", "-t", "org/t-GGUF:F16", "-o",
                       tmp_path / "out.gguf", HF_HUB_OFFLINE=offline)
        _one_line(proc, "t-F16.gguf", "outside")


def test_an_api_answer_announcing_too_much_is_not_read(hub, tmp_path):
    _repo(hub)

    def announces(handler):
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(64 << 20))
        handler.end_headers()
        handler.wfile.write(b"{")
        handler.close_connection = True

    hub.answer(INFO, announces)
    proc, took = _convert(hub, tmp_path, DFLASH_GGUF_HUB_TIMEOUT="30")
    _one_line(proc, f"announces a {64 << 20}-byte answer")
    assert took < 20  # refused on the header, not after waiting for a body that never comes


def test_the_guard_s_hooks_into_httpx2_exist_or_are_one_line():
    """The guard wraps httpx2's private connection pool (no public way in): the installed httpx2 has
    it, and one without it is refused in one line, not a traceback at the first request."""
    import httpx2

    from dflash_gguf.errors import DflashError
    from dflash_gguf.hub.transport import private_hooks

    assert hasattr(private_hooks(httpx2.HTTPTransport())._network_backend, "connect_tcp")
    with pytest.raises(DflashError, match="lacks the internals the Hub guard needs"):
        private_hooks(object())
