"""`dflash-gguf watch URL`: live acceptance from a real llama-server, and one line (exit 1 or 2, no
traceback) from anything else that answers, or nothing."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dflash_gguf.runner.launch import dflash_server
from tests.conftest import REPO, dflash_gguf

SMALL = ["-c", "512", "-t", "1"]
METRICS = ("# HELP llamacpp:tokens_predicted_total x\nllamacpp:tokens_predicted_total 10\n"
           "llamacpp:spec_decode_num_draft_tokens_total 30\nllamacpp:spec_decode_num_accepted_tokens_total 6\n"
           "llamacpp:spec_decode_num_drafts_total 4\n"
           'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 4\n'
           'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 2\n')
SLOTS = json.dumps([{"id": 0, "is_processing": False, "next_token": [{"n_decoded": 10}]}])


@pytest.fixture(scope="module")
def server(llama_bin: Path, target_gguf: Path, converted: dict[str, Path]):
    with dflash_server(target_gguf, converted["dflash-b16"], bin_dir=llama_bin, server_args=SMALL) as s:
        yield s


@pytest.mark.integration
def test_once_json_after_a_request_agrees_with_the_response_timings(server):
    answer = server.client.complete("The capital of France is", n_predict=24)
    assert answer.draft_n > 0, answer.timings
    proc = dflash_gguf("watch", server.client.url, "--once", "--json")
    assert proc.returncode == 0, proc.stderr
    (slot,) = json.loads(proc.stdout)["slots"]
    assert slot["id"] == 0 and slot["processing"] is False and slot["scope"] == "server"
    assert slot["draft_tokens"] == answer.draft_n and slot["accepted_tokens"] == answer.draft_n_accepted
    assert slot["drafts"] > 0 and slot["tau"] == pytest.approx(1 + answer.draft_n_accepted / slot["drafts"])
    assert slot["acceptance"] == pytest.approx(answer.draft_n_accepted / answer.draft_n)
    assert slot["draft_length"] == pytest.approx(answer.draft_n / slot["drafts"])
    assert len(slot["acceptance_by_depth"]) >= 1 and all(0 <= a <= 1 for a in slot["acceptance_by_depth"])
    assert slot["tokens_per_second"] is not None and slot["tokens_per_second"] > 0


@pytest.mark.integration
def test_a_pipe_gets_plain_lines_until_ctrl_c_which_exits_0(server):
    proc = subprocess.Popen([sys.executable, "-m", "dflash_gguf.cli", "watch", server.client.url, "--interval", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            # as a terminal starts it: a suite started in the background inherits SIGINT ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first = proc.stdout.readline()
        second = proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and "Traceback" not in err, err
    for line in (first, second):
        assert "slot 0 idle: tau" in line and "tok/s" in line and "draft n" in line and "\x1b" not in line


# --- hostile servers ----------------------------------------------------------------------------

def _hostile(routes: dict[str, tuple[int, str, bytes]]):
    """A local HTTP server answering each path with (status, content type, body)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            status, kind, body = routes.get(self.path, (404, "text/plain", b"not found"))
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:
                pass

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def _watch(httpd) -> subprocess.CompletedProcess:
    try:
        return dflash_gguf("watch", f"http://127.0.0.1:{httpd.server_address[1]}", "--once", "--timeout", "5")
    finally:
        httpd.shutdown()
        httpd.server_close()


HTML = (200, "text/html", b"<!doctype html><html><body>It works!</body></html>")


@pytest.mark.parametrize("routes, needle", [
    ({"/slots": HTML, "/metrics": HTML}, "/slots: the answer is not JSON"),
    ({"/slots": (200, "application/json", b'[{"id": 0,'), "/metrics": (200, "text/plain", METRICS.encode())},
     "/slots: the answer is not JSON"),
    ({"/slots": (200, "application/json", b'{"status": "ok"}')}, "not a list of slots"),
    ({"/slots": (200, "application/json", b"[" + b" " * (5 << 20) + b"]")}, "over 4 MiB"),
    ({"/slots": (200, "application/json", SLOTS.encode()),
      "/metrics": (200, "text/plain", METRICS.replace(" 30\n", " thirty\n").encode())},
     "spec_decode_num_draft_tokens_total is 'thirty'"),
    ({"/slots": (200, "application/json", SLOTS.encode()), "/metrics": HTML}, "not a Prometheus sample"),
    ({"/slots": (200, "application/json", SLOTS.encode()),
      "/metrics": (501, "application/json", b'{"error": {"message": "no metrics"}}')}, "--metrics"),
    ({"/slots": (404, "text/html", b"<html>nope</html>")}, "HTTP 404"),
])
def test_garbage_is_one_line_and_exit_2(routes, needle):
    proc = _watch(_hostile(routes))
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.startswith("error: ") and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr and proc.stdout == ""


def test_a_well_formed_answer_is_read(tmp_path):
    # the same server with sound answers: what the garbage cases differ from
    proc = _watch(_hostile({"/slots": (200, "application/json", SLOTS.encode()),
                            "/metrics": (200, "text/plain", METRICS.encode())}))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("slot 0 idle: tau 2.50 (server) | by depth 1.00 0.50 | n/a tok/s | draft n 7.5")


def test_a_server_that_is_gone_is_exit_1():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = dflash_gguf("watch", f"http://127.0.0.1:{port}", "--once")
    assert proc.returncode == 1 and proc.stderr.startswith("error: cannot reach llama-server"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_url_that_is_not_one_is_refused():
    proc = dflash_gguf("watch", "127.0.0.1:8080", "--once")
    assert proc.returncode == 2 and "give a running llama-server's address" in proc.stderr
