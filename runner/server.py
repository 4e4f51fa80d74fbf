"""One `llama-server` process, owned by a context manager, and a small client for its HTTP API.

    with dflash_server("target.gguf", "dflash-target.gguf") as server:   # checks the pair, starts, waits
        answer = server.complete("The capital of France is", n_predict=32)
        print(answer.content, answer.draft_n_accepted, "/", answer.draft_n)
        print(server.metrics().acceptance)
    # the process is gone here, whatever happened inside the block

`LlamaServer` starts the binary of the patched build (`runner.build.find_build`) with its output
captured to a log file, waits for `/health` to answer ok, and always reaps the process: SIGTERM,
then SIGKILL after a grace period, on normal exit, on an exception and on KeyboardInterrupt. On
Linux the server also gets SIGTERM if the Python process dies without running its cleanup.
When the server exits during start-up (a drafter refused by the patched llama.cpp, a port in use,
an abort) the error quotes the line of its log that says why.

The client speaks the server's native API (tools/server/README.md of the pinned tree): POST
`/completion` (`return_tokens`, `n_probs`; the response's `timings.draft_n` and
`timings.draft_n_accepted` count this request's drafted and accepted tokens), POST `/tokenize`,
POST `/detokenize`, GET `/health`, and GET `/metrics` (Prometheus text, only with `--metrics`).
HTTP goes through the standard library only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..convert import layout
from ..convert.compat import DrafterFacts, check_dflash2_shapes, check_fits_target
from ..convert.gguf_file import GGUFFile
from ..convert.target import load_target
from ..errors import CheckpointError, DflashError, LlamaBuildError
from . import build as _build

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
STARTUP_TIMEOUT = 300.0   # seconds for the model(s) to load before /health must say ok
STOP_GRACE = 10.0         # seconds between SIGTERM and SIGKILL
METRIC_PREFIX = "llamacpp:"
DEFAULT_BLOCK_SIZE = 16   # what llama.cpp assumes without dflash.block_size

# llama.cpp logs this while it measures memory; it is not an error (FACTS §2)
_HARMLESS = ("ctx_other",)
_LEVEL_PREFIX = re.compile(r"^\s*\d+\.\d+\.\d+\.\d+ ([DIWE]) ")  # "0.01.044.800 E text"
_BIND_FAILED = "couldn't bind HTTP server socket"


class ServerError(DflashError):
    """llama-server could not be started, stopped responding, or answered with an error."""


class ServerStartError(ServerError):
    """llama-server exited or did not become ready during start-up; the message quotes its log."""

    def __init__(self, message: str, returncode: int | None = None, log_path: Path | None = None):
        super().__init__(message)
        self.returncode = returncode
        self.log_path = log_path


# ---------------------------------------------------------------------------------------------
# What the server returns
# ---------------------------------------------------------------------------------------------

@dataclass
class Completion:
    """One answer of POST /completion."""

    content: str
    tokens: list[int]              # generated token ids ("return_tokens": true)
    stop_type: str                 # "eos", "limit", "word" or "none"
    n_prompt: int                  # prompt tokens evaluated (tokens_evaluated)
    n_predicted: int               # tokens generated (tokens_predicted)
    draft_n: int                   # tokens the drafter proposed for this request (timings.draft_n)
    draft_n_accepted: int          # of which the target accepted (timings.draft_n_accepted)
    timings: dict[str, Any]
    probs: list[dict] | None       # completion_probabilities, when n_probs > 0
    raw: dict[str, Any] = field(repr=False)

    @property
    def acceptance(self) -> float | None:
        """Accepted / drafted tokens of this request; None when nothing was drafted."""
        return self.draft_n_accepted / self.draft_n if self.draft_n else None

    @property
    def tokens_per_second(self) -> float | None:
        value = self.timings.get("predicted_per_second")
        return float(value) if value is not None else None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Completion":
        timings = data.get("timings") or {}
        return cls(
            content=data.get("content", ""),
            tokens=[int(t) for t in data.get("tokens") or []],
            stop_type=str(data.get("stop_type", "")),
            n_prompt=int(data.get("tokens_evaluated", 0)),
            n_predicted=int(data.get("tokens_predicted", 0)),
            draft_n=int(timings.get("draft_n", 0)),
            draft_n_accepted=int(timings.get("draft_n_accepted", 0)),
            timings=timings,
            probs=data.get("completion_probabilities"),
            raw=data,
        )


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus(text: str) -> list[Sample]:
    """The samples of a Prometheus text exposition (comments and blank lines skipped)."""
    samples = []
    line_re = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(\{([^}]*)\})?\s+(\S+)')
    label_re = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = line_re.match(line)
        if not match:
            continue
        labels = dict(label_re.findall(match.group(3) or ""))
        try:
            value = float(match.group(4))
        except ValueError:
            continue
        samples.append(Sample(match.group(1), labels, value))
    return samples


@dataclass
class Metrics:
    """GET /metrics, by metric name without the `llamacpp:` prefix (FACTS §3)."""

    values: dict[str, float]                      # unlabelled samples
    accepted_per_position: list[float]            # spec_decode_num_accepted_tokens_per_pos_total

    @classmethod
    def from_text(cls, text: str) -> "Metrics":
        values: dict[str, float] = {}
        per_pos: dict[int, float] = {}
        for s in parse_prometheus(text):
            name = s.name[len(METRIC_PREFIX):] if s.name.startswith(METRIC_PREFIX) else s.name
            if name == "spec_decode_num_accepted_tokens_per_pos_total" and "position" in s.labels:
                per_pos[int(s.labels["position"])] = s.value
            elif not s.labels:
                values[name] = s.value
        n = max(per_pos) + 1 if per_pos else 0
        return cls(values, [per_pos.get(i, 0.0) for i in range(n)])

    def get(self, name: str, default: float = 0.0) -> float:
        return self.values.get(name, default)

    @property
    def draft_tokens(self) -> int:
        return int(self.get("spec_decode_num_draft_tokens_total"))

    @property
    def accepted_tokens(self) -> int:
        return int(self.get("spec_decode_num_accepted_tokens_total"))

    @property
    def drafts(self) -> int:
        """Verification steps that carried a draft."""
        return int(self.get("spec_decode_num_drafts_total"))

    @property
    def acceptance(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens gained per verification step: 1 + accepted / drafts (the log's "mean len")."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else None

    def since(self, earlier: "Metrics") -> "Metrics":
        """Counters accumulated after `earlier` (gauges are taken from self)."""
        values = dict(self.values)
        for name, value in self.values.items():
            if name.endswith("_total") and name in earlier.values:
                values[name] = value - earlier.values[name]
        n = len(self.accepted_per_position)
        old = earlier.accepted_per_position + [0.0] * max(0, n - len(earlier.accepted_per_position))
        return Metrics(values, [a - b for a, b in zip(self.accepted_per_position, old, strict=False)])

    def summary(self) -> dict[str, Any]:
        return {
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "drafts": self.drafts,
            "acceptance": self.acceptance,
            "mean_accepted_length": self.mean_accepted_length,
            "accepted_per_position": [int(v) for v in self.accepted_per_position],
        }


# ---------------------------------------------------------------------------------------------
# The HTTP client
# ---------------------------------------------------------------------------------------------

class LlamaClient:
    """The native llama-server API at `url` (e.g. http://127.0.0.1:8080)."""

    def __init__(self, url: str, timeout: float | None = 600.0):
        self._url = url.rstrip("/")
        self.timeout = timeout
        self._openers: dict[bool, urllib.request.OpenerDirector] = {}

    def _opener(self) -> urllib.request.OpenerDirector:
        """No HTTP proxy for a server on this machine (an http_proxy variable must not divert it)."""
        host = (urllib.parse.urlsplit(self.url).hostname or "").lower()
        local = host in ("localhost", "::1") or host.startswith("127.")
        if local not in self._openers:
            handlers = [urllib.request.ProxyHandler({})] if local else []
            self._openers[local] = urllib.request.build_opener(*handlers)
        return self._openers[local]

    @property
    def url(self) -> str:
        return self._url

    def _request(self, method: str, path: str, body: dict | None = None,
                 timeout: float | None = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with self._opener().open(req, timeout=timeout if timeout is not None else self.timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            payload = err.read()
            raise ServerError(f"{method} {self.url}{path}: HTTP {err.code}: {_error_message(payload)}") from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise ServerError(f"cannot reach llama-server at {self.url} ({reason})") from None

    def _json(self, method: str, path: str, body: dict | None = None, timeout: float | None = None) -> Any:
        _, payload = self._request(method, path, body, timeout)
        try:
            return json.loads(payload)
        except json.JSONDecodeError:
            raise ServerError(f"{method} {self.url}{path}: the answer is not JSON: {payload[:200]!r}") from None

    def health(self, timeout: float = 2.0) -> bool:
        """True when the model is loaded (GET /health answers 200 with status ok)."""
        try:
            status, payload = self._request("GET", "/health", timeout=timeout)
        except ServerError:
            return False
        try:
            return status == 200 and json.loads(payload).get("status") == "ok"
        except (json.JSONDecodeError, AttributeError):
            return False

    def complete(self, prompt: str | Sequence[int], n_predict: int = 64, *, temperature: float = 0.0,
                 n_probs: int = 0, seed: int | None = None, stop: Sequence[str] | None = None,
                 cache_prompt: bool = True, timeout: float | None = None, **options: Any) -> Completion:
        """POST /completion for one prompt (text, or token ids); the generated ids come back too.

        `temperature` 0 is greedy. Extra keyword options go into the request as they are
        (`top_k=1`, `ignore_eos=True`, ...).
        """
        body: dict[str, Any] = {
            "prompt": prompt if isinstance(prompt, str) else [int(t) for t in prompt],
            "n_predict": int(n_predict),
            "temperature": float(temperature),
            "return_tokens": True,
            "cache_prompt": bool(cache_prompt),
            "stream": False,
        }
        if n_probs:
            body["n_probs"] = int(n_probs)
        if seed is not None:
            body["seed"] = int(seed)
        if stop:
            body["stop"] = list(stop)
        body.update(options)
        data = self._json("POST", "/completion", body, timeout)
        if isinstance(data, list):  # the server answers a list only for several prompts
            data = data[0]
        return Completion.from_json(data)

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        data = self._json("POST", "/tokenize",
                          {"content": text, "add_special": add_special, "parse_special": parse_special})
        return [int(t["id"]) if isinstance(t, dict) else int(t) for t in data.get("tokens", [])]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return str(self._json("POST", "/detokenize", {"tokens": [int(t) for t in tokens]}).get("content", ""))

    def props(self) -> dict[str, Any]:
        return self._json("GET", "/props")

    def metrics(self) -> Metrics:
        """GET /metrics (the server needs `--metrics`; ServerError otherwise)."""
        _, payload = self._request("GET", "/metrics")
        return Metrics.from_text(payload.decode("utf-8", errors="replace"))


def _error_message(payload: bytes) -> str:
    try:
        data = json.loads(payload)
        if isinstance(data, dict):
            err = data.get("error", data)
            if isinstance(err, dict) and "message" in err:
                return str(err["message"])
    except json.JSONDecodeError:
        pass
    return payload.decode("utf-8", errors="replace").strip()[:300] or "no details"


# ---------------------------------------------------------------------------------------------
# Speculative flags and the pre-flight check, from the drafter's own metadata
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DraftInfo:
    path: Path
    spec_type: str         # "draft-dflash" or "draft-dspark" (llama.cpp's --spec-type names)
    block_size: int
    draft_max: int         # the longest draft llama.cpp makes with this drafter
    facts: DrafterFacts


def read_draft(draft_gguf: str | Path) -> DraftInfo:
    """What llama-server needs to know about a drafter GGUF, read from its metadata."""
    path = Path(draft_gguf)
    with GGUFFile(path) as f:
        arch = f.architecture
        if arch == layout.LEGACY_ARCH:
            raise CheckpointError(
                f"{path}: legacy fork layout (general.architecture = {arch}); mainline llama.cpp refuses it. "
                f"Migrate it: dflash-gguf convert {path} -o NEW.gguf")
        if arch != layout.ARCH:
            raise CheckpointError(f"{path}: general.architecture is {arch!r}, not {layout.ARCH!r}: not a DFlash drafter")
        a = layout.ARCH + "."
        hidden = f.get(a + "embedding_length")
        layers = f.get(a + "target_layers")
        if hidden is None or not layers:
            missing = a + ("embedding_length" if hidden is None else "target_layers")
            raise CheckpointError(f"{path}: key {missing} is missing; re-convert the drafter with dflash-gguf convert")
        tokens = f.get("tokenizer.ggml.tokens")
        is_dspark = any(t in f.tensors for t, v in layout.VARIANT_MARKERS.items() if v == layout.DSPARK)
        block_size = int(f.get(a + "block_size") or DEFAULT_BLOCK_SIZE)
        from_anchor = f.get(a + "sample_from_anchor")
        facts = DrafterFacts(
            source=str(path),
            hidden=int(hidden),
            vocab=len(tokens) if tokens else None,
            target_layer_ids=tuple(int(i) - 1 for i in layers),
            mask_token_id=f.get("tokenizer.ggml.mask_token_id"),
            conv_group_size=f.get(a + "conv_group_size"),
            selector_top_k=f.get(a + "selector_top_k"),
        )
    # common/speculative.cpp: DFlash denoises [anchor, mask * (block_size-1)] into block_size-1
    # drafts; anchor-first DSpark (dflash.sample_from_anchor, default true) drafts a whole block
    draft_max = block_size if is_dspark and from_anchor is not False else block_size - 1
    return DraftInfo(path=path, spec_type="draft-dspark" if is_dspark else "draft-dflash",
                     block_size=block_size, draft_max=max(1, draft_max), facts=facts)


def speculative_args(draft_gguf: str | Path, draft_max: int | None = None) -> list[str]:
    """llama-server flags that run `draft_gguf` as a DFlash drafter at its full trained draft length."""
    info = read_draft(draft_gguf)
    n_max = info.draft_max if draft_max is None else min(int(draft_max), info.draft_max)
    return ["-md", str(info.path), "--spec-type", info.spec_type, "--spec-draft-n-max", str(n_max)]


def check_pair(target_gguf: str | Path, draft_gguf: str | Path) -> list[str]:
    """The converter's rules on a (target, drafter) GGUF pair: DflashError when the drafter cannot
    run with this target (hidden size, layer range, vocabulary, mask token, DFlash 2 shapes);
    warnings otherwise."""
    info = read_draft(draft_gguf)
    check_dflash2_shapes(info.facts)
    return check_fits_target(info.facts, load_target(target_gguf))


# ---------------------------------------------------------------------------------------------
# The process
# ---------------------------------------------------------------------------------------------

def free_port(host: str = DEFAULT_HOST) -> int:
    """A TCP port nobody listens on right now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _strip_prefix(line: str) -> str:
    match = _LEVEL_PREFIX.match(line)
    return line[match.end():].strip() if match else line.strip()


def error_line(lines: Sequence[str]) -> str | None:
    """The line of a llama-server log that best says why it stopped."""
    lines = [line.rstrip() for line in lines if line.strip()]
    useful = [line for line in lines if not any(h in line for h in _HARMLESS)
              and not re.match(r"#\d+\s", line)]  # gdb backtrace frames printed after an abort

    def level(line: str) -> str | None:
        match = _LEVEL_PREFIX.match(line)
        return match.group(1) if match else None

    tests = (
        lambda l: re.search(r"(^|\s)dflash: ", l) is not None and level(l) in ("E", None),  # patched checks
        lambda l: "GGML_ASSERT" in l or "GGML_ABORT" in l,
        lambda l: level(l) == "E" and "exiting due to" not in l,
        lambda l: re.search(r"\berror\b|\bfailed\b|terminate called|what\(\)", l, re.IGNORECASE) is not None,
    )
    for test in tests:
        hits = [line for line in useful if test(line)]
        if hits:
            return _strip_prefix(hits[0])
    return _strip_prefix(useful[-1]) if useful else None


def find_bin_dir(backend: str | None = None) -> Path:
    """The bin folder of the patched build for `backend`. Without a backend: the default
    backend's build, else the CPU build when that is the one that exists."""
    found = _build.find_build(backend)
    if found is None and backend is None and _build.default_backend() != "cpu":
        found = _build.find_build("cpu")
        if found is not None:
            log.info("no %s build of the patched llama.cpp; using the cpu build %s", _build.default_backend(), found)
    if found is None:
        raise LlamaBuildError(
            f"no patched llama.cpp build for backend {backend or _build.default_backend()}; "
            f"build it with `dflash-gguf llama build{' --backend ' + backend if backend else ''}`")
    return Path(found)


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def _pdeathsig_hook():
    """A function for Popen's preexec_fn that makes the child get SIGTERM when its parent dies
    (Linux PR_SET_PDEATHSIG); None where that is not available. libc is resolved here, in the
    parent, so the child runs no import between fork and exec."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None  # the signal follows the creating *thread*; only the main thread lives as long as we do
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    sigterm = int(signal.SIGTERM)

    def hook() -> None:
        prctl(1, sigterm)  # PR_SET_PDEATHSIG

    return hook


class LlamaServer(LlamaClient):
    """A `llama-server` process: started on `__enter__` (or `start()`), always reaped on exit.

    `model` is the target GGUF, `draft` an optional drafter GGUF (give its flags in `args`, e.g.
    from `speculative_args`), `args` any other llama-server arguments. `port=None` picks a free
    port. `bin_dir` defaults to the patched build for `backend` (`runner.build.find_build`).
    The server's output goes to `log_path` (default: a temporary file, removed after a clean
    stop and kept when start-up failed so that the error can point at it).
    """

    def __init__(self, model: str | Path, args: Sequence[str] = (), *, bin_dir: str | Path | None = None,
                 backend: str | None = None, host: str = DEFAULT_HOST, port: int | None = None,
                 log_path: str | Path | None = None, startup_timeout: float = STARTUP_TIMEOUT,
                 stop_grace: float = STOP_GRACE, request_timeout: float | None = 600.0,
                 env: dict[str, str] | None = None):
        super().__init__("", timeout=request_timeout)
        if bin_dir is None:
            bin_dir = find_bin_dir(backend)
        exe = Path(bin_dir) / ("llama-server.exe" if sys.platform == "win32" else "llama-server")
        if not exe.is_file():
            raise LlamaBuildError(f"{exe}: not found; rebuild with `dflash-gguf llama build --force`")
        self.exe = exe
        self.model = Path(model)
        self.args = [str(a) for a in args]
        self.host = host
        self.port = port
        self._fixed_port = bool(port)  # None or 0: pick a free one
        self.startup_timeout = startup_timeout
        self.stop_grace = stop_grace
        self.env = _build.runtime_env(exe.parent, env)
        self._own_log = log_path is None
        self.log_path = Path(log_path) if log_path is not None else None
        self._proc: subprocess.Popen | None = None
        self._log_handle = None

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}" if self.port else ""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def command(self) -> list[str]:
        return [str(self.exe), "-m", str(self.model), "--host", self.host, "--port", str(self.port), *self.args]

    def __enter__(self) -> "LlamaServer":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> "LlamaServer":
        """Start the server and wait until /health says ok; ServerStartError if it does not."""
        if self._proc is not None:
            raise ServerError("this LlamaServer is already running")
        if not self.model.is_file():
            raise ServerError(f"{self.model}: no such model file")
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        else:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log_path.write_bytes(b"")  # this run's log only: errors are quoted from it
        try:
            for attempt in range(3):
                if not self._fixed_port:
                    self.port = free_port(self.host)
                self._spawn()
                try:
                    self._wait_ready()
                    return self
                except ServerStartError as err:
                    self.stop(keep_log=True)
                    # another process took the port between free_port() and the bind: try another
                    if self._fixed_port or attempt == 2 or _BIND_FAILED not in self.log_tail(20):
                        raise err
            raise AssertionError("unreachable")
        except BaseException:
            self.stop(keep_log=True)
            raise

    def _spawn(self) -> None:
        assert self.log_path is not None
        self._log_handle = open(self.log_path, "ab")
        cmd = self.command()
        log.info("starting %s", " ".join(cmd))
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=self._log_handle, stderr=subprocess.STDOUT, env=self.env,
            start_new_session=True,  # Ctrl-C reaches us, not the server: we stop it ourselves
            preexec_fn=_pdeathsig_hook())

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        delay = 0.05
        while True:
            rc = self._proc.poll()
            if rc is not None:
                raise self._start_error(rc)
            if self.health(timeout=2.0):
                log.info("llama-server ready at %s (pid %d)", self.url, self._proc.pid)
                return
            if time.monotonic() > deadline:
                tail = " | ".join(_strip_prefix(l) for l in self.log_tail(5).splitlines() if l.strip())
                raise ServerStartError(
                    f"llama-server did not become ready within {self.startup_timeout:g} s; "
                    f"last log lines: {tail or '(empty)'} (log: {self.log_path})",
                    None, self.log_path)
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _start_error(self, rc: int) -> ServerStartError:
        reason = error_line(self.log_tail(400).splitlines()) or "no output"
        if rc < 0:
            how = f"crashed ({_signal_name(rc)})"
        else:
            how = f"exited with status {rc}"
        return ServerStartError(f"llama-server {how} during start-up: {reason} (log: {self.log_path})",
                                rc, self.log_path)

    def log_tail(self, n_lines: int = 40) -> str:
        """The last lines of the server's log."""
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - 256 * 1024))
                data = fh.read()
        except OSError:
            return ""
        return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-n_lines:])

    def wait(self, timeout: float | None = None) -> int:
        """Block until the server exits by itself; its return code."""
        if self._proc is None:
            raise ServerError("this LlamaServer is not running")
        return self._proc.wait(timeout)

    def stop(self, keep_log: bool = False) -> int | None:
        """Stop the server (SIGTERM, SIGKILL after `stop_grace` s) and reap it; its return code.

        A second KeyboardInterrupt while waiting still kills and reaps the process. The log is
        kept (not deleted) with `keep_log` or when the server had died on its own.
        """
        proc, self._proc = self._proc, None
        rc = None
        try:
            if proc is not None:
                try:
                    if proc.poll() is not None:
                        keep_log = True  # it died by itself: its log says why
                    else:
                        proc.terminate()
                        try:
                            proc.wait(self.stop_grace)
                        except subprocess.TimeoutExpired:
                            log.warning("llama-server (pid %d) ignored SIGTERM for %g s; killing it",
                                        proc.pid, self.stop_grace)
                finally:
                    if proc.poll() is None:
                        proc.kill()
                    rc = proc.wait()
        finally:
            if self._log_handle is not None:
                self._log_handle.close()
                self._log_handle = None
            if self._own_log and not keep_log and self.log_path is not None:
                with contextlib.suppress(OSError):
                    self.log_path.unlink()
                self.log_path = None
        return rc


# ---------------------------------------------------------------------------------------------
# A target + drafter server, as `serve` and `generate` start it
# ---------------------------------------------------------------------------------------------

def dflash_server(target: str | Path, draft: str | Path | None, *, parallel: int | None = 1,
                  extra_args: Sequence[str] = (), draft_max: int | None = None, check: bool = True,
                  metrics: bool = True, **kwargs: Any) -> LlamaServer:
    """A LlamaServer for `target` with `draft` as its DFlash drafter (not started yet).

    `check` first applies the converter's rules to the pair (DflashError on a mismatch, before any
    process starts). `parallel` sets `--parallel` (one slot by default: acceptance drops with many
    slots, llama.cpp #27117); `extra_args` go last, so they override anything set here. Other
    keyword arguments go to LlamaServer (backend, bin_dir, port, log_path, startup_timeout, ...).
    """
    args: list[str] = []
    if draft is not None:
        if check:
            for warning in check_pair(target, draft):
                log.warning(warning)
        args += speculative_args(draft, draft_max)
    if metrics:
        args.append("--metrics")
    if parallel is not None:
        args += ["--parallel", str(parallel)]
    args += [str(a) for a in extra_args]
    return LlamaServer(target, args, **kwargs)


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when the process gets SIGTERM (or SIGHUP) inside `stop_on_signals`."""


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into a `Terminated` exception, and SIGINT into KeyboardInterrupt
    (even where the shell started us with SIGINT ignored, as it does for `cmd &`), while the
    block runs, so that the context managers inside it (a LlamaServer) clean up as on Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        raise Terminated(signal.Signals(signum).name)

    def interrupt(_signum, _frame):
        raise KeyboardInterrupt("SIGINT")

    previous = {}
    for name, function in (("SIGTERM", handler), ("SIGHUP", handler), ("SIGINT", interrupt)):
        if hasattr(signal, name):
            sig = getattr(signal, name)
            previous[sig] = signal.signal(sig, function)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
