"""The llama-server HTTP API: a small client and the results it returns.

The client speaks the server's native API (tools/server/README.md of the pinned tree): POST
`/completion` (`return_tokens`, `n_probs`; the response's `timings.draft_n` and
`timings.draft_n_accepted` count this request's drafted and accepted tokens), POST `/tokenize`,
POST `/detokenize`, GET `/health`, and GET `/metrics` (Prometheus text, only with `--metrics`).
With an API key (`llama-server --api-key`) every request carries it as a bearer token. HTTP goes
through the standard library only.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Sequence

from dflash_gguf.errors import ServerError

METRIC_PREFIX = "llamacpp:"

# ---------------------------------------------------------------------------------------------
# What the server returns
# ---------------------------------------------------------------------------------------------

def is_server_url(url: str) -> bool:
    """Whether `url` can name a running llama-server: http(s), a host, a port (if any) in range."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in range
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


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
    """GET /metrics (llama-server `--metrics`), by metric name without the `llamacpp:` prefix."""

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

    def __init__(self, url: str, timeout: float | None = 600.0, api_key: str | None = None):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.api_key = api_key
        self._openers: dict[bool, urllib.request.OpenerDirector] = {}

    def _opener(self) -> urllib.request.OpenerDirector:
        """No HTTP proxy for a server on this machine (an http_proxy variable must not divert it)."""
        host = (urllib.parse.urlsplit(self.url).hostname or "").lower()
        local = host in ("localhost", "::1", "0.0.0.0", "::") or host.startswith("127.")
        if local not in self._openers:
            handlers = [urllib.request.ProxyHandler({})] if local else []
            self._openers[local] = urllib.request.build_opener(*handlers)
        return self._openers[local]

    def _request(self, method: str, path: str, body: dict | None = None,
                 timeout: float | None = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data else {}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
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

    def apply_template(self, messages: Sequence[dict[str, Any]]) -> str:
        """The prompt the server's chat template makes of `messages` (as /v1/chat/completions would)."""
        data = self._json("POST", "/apply-template", {"messages": list(messages)})
        prompt = data.get("prompt") if isinstance(data, dict) else None
        if not isinstance(prompt, str):
            raise ServerError(f"POST {self.url}/apply-template: no prompt in the answer")
        return prompt

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

