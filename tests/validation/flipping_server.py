"""A test-only stand-in for llama-server that changes one accepted draft token in its answer.

`python -m tests.validation.flipping_server REAL_LLAMA_SERVER ARGS...` starts the real llama-server with ARGS
on a port of its own, passes its log through unchanged (stderr), and answers HTTP on the port ARGS
asked for by forwarding every request. In the first /completion answer (after the warm-up, whose
prompt has at most 8 tokens) that holds a drafted token the target accepted, that token is
replaced by the next id: what a bug between verification and the response would do. The real
server's log says which tokens were accepted drafts (`accepted A/N draft tokens` after each step's
`next token` lines), so the altered token is known to be one. With DFLASH_TEST_FLIP_ANY=1 any new
token after the first may be the one (on a target whose drafts are never accepted). The altered
position is written to the file named by DFLASH_TEST_FLIP_RECORD.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_TOKEN = re.compile(r"task (\d+) \| n_gen = (\d+), n_remaining = -?\d+, next token:\s*(\d+)")
_ACCEPTED = re.compile(r"task (\d+) \| accepted (\d+)/(\d+) draft tokens, new n_tokens")
_STEP = re.compile(r"task (\d+) \| (generate_draft|slot decode token)")


class LogWatch:
    """Per task: the emitted tokens in order, and which of them were accepted drafts."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tokens: dict[int, list[int]] = {}
        self.accepted: dict[int, set[int]] = {}
        self.step: dict[int, list[int]] = {}  # indices emitted since the task's last step line
        self.last_task = -1

    def feed(self, line: str) -> None:
        with self.lock:
            if (m := _STEP.search(line)) is not None:
                self.step[int(m[1])] = []
            elif (m := _TOKEN.search(line)) is not None:
                task = int(m[1])
                self.tokens.setdefault(task, []).append(int(m[3]))
                self.step.setdefault(task, []).append(int(m[2]) - 1)
                self.last_task = max(self.last_task, task)
            elif (m := _ACCEPTED.search(line)) is not None:
                task, a = int(m[1]), int(m[2])
                self.accepted.setdefault(task, set()).update(self.step.get(task, [])[:a])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    real, args = sys.argv[1], sys.argv[2:]
    port = int(args[args.index("--port") + 1])
    host = args[args.index("--host") + 1] if "--host" in args else "127.0.0.1"
    inner = _free_port()
    inner_args = list(args)
    inner_args[args.index("--port") + 1] = str(inner)
    proc = subprocess.Popen([real, *inner_args], stdout=sys.stdout, stderr=subprocess.PIPE, text=True,
                            errors="replace")
    watch = LogWatch()

    def pump() -> None:
        for line in proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            watch.feed(line)

    threading.Thread(target=pump, daemon=True).start()
    flipped = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _forward(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            conn = http.client.HTTPConnection("127.0.0.1", inner, timeout=600)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
            try:
                conn.request(method, self.path, body=body, headers=headers)
                answer = conn.getresponse()
                data, status = answer.read(), answer.status
                kind = answer.getheader("Content-Type", "application/json")
            except OSError:
                data, status, kind = b'{"error": "starting"}', 503, "application/json"
            finally:
                conn.close()
            if method == "POST" and self.path.startswith("/completion") and status == 200 and body:
                data = self._maybe_flip(json.loads(body), data)
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _maybe_flip(self, request: dict, data: bytes) -> bytes:
            prompt = request.get("prompt")
            if flipped.is_set() or not isinstance(prompt, list) or len(prompt) <= 8:
                return data
            answer = json.loads(data)
            tokens = answer.get("tokens") or []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # the log is written a moment after the answer
                with watch.lock:
                    task = watch.last_task
                    if watch.tokens.get(task) == tokens and os.environ.get("DFLASH_TEST_FLIP_ANY") == "1":
                        positions = list(range(1, len(tokens)))
                        break
                    if watch.tokens.get(task) == tokens and task in watch.accepted:
                        positions = sorted(watch.accepted[task])
                        break
                time.sleep(0.05)
            else:
                return data
            if not positions:
                return data
            at = positions[len(positions) // 2]
            tokens[at] = tokens[at] + 1
            answer["tokens"] = tokens
            flipped.set()
            record = os.environ.get("DFLASH_TEST_FLIP_RECORD")
            if record:
                with open(record, "w") as f:
                    json.dump({"position": at, "accepted_positions": positions, "prompt": prompt}, f)
            return json.dumps(answer).encode()

        def do_GET(self) -> None:
            self._forward("GET")

        def do_POST(self) -> None:
            self._forward("POST")

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sys.exit(proc.wait())
    except KeyboardInterrupt:
        pass
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)
        server.shutdown()


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    main()
