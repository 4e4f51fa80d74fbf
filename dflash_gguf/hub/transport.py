"""The one guarded transport for all Hub traffic: huggingface_hub's and the project's own.

huggingface_hub sends every request through one shared httpx client, made by a factory a program
may supply (`set_client_factory`); `install()` supplies this one. Whatever a server (the Hub, a
mirror, or something pretending to be one) answers, the client holds to:

- the token (the Authorization header) goes only to the configured endpoint's scheme, host and
  port: never to a redirect, a listing's next-page link or an upload's verify URL elsewhere (GitHub's
  id-token request of the OIDC exchange carries GitHub's own token, to GitHub's URL only);
- a request with a body (the OIDC exchange's id token, a commit) is never redirected to another host
  (307, 308), and the access token the exchange answers is known to the secret filter at once;
- a response header holding a byte above 0x7f (which no rebuilt response can carry) is refused by name;
- every request has a total deadline (connect, headers and body): its answer starts within
  DFLASH_GGUF_HUB_TIMEOUT seconds, its body averages MIN_RATE bytes a second and is never silent that
  long; a command's Hub traffic gets COMMAND_TIMEOUTS such deadlines plus its bytes at MIN_RATE; and
  every request stops within SLICE_S of SIGINT, SIGTERM or SIGHUP (downloads run in huggingface_hub's
  worker threads, which a signal does not reach);
- a command gets RETRY_LIMIT answers that ask to be retried (429, 5xx) and waits at most about a
  second after each: a Retry-After of an hour, or a storm of 503s, ends in one line, not a wait;
- an API answer is at most API_BODY_LIMIT bytes, decompressed included (a gzip bomb stops there), and
  a file's body is never decompressed: it was asked for as is;
- a file's body is read up to the size the Hub announced for it (its listing, else the first answer
  giving one) and not a byte beyond; an answer announcing another size is refused (`_Announced`), so
  no blob unlike the announcement is stored in the cache;
- a connect, name lookup or TLS handshake is waited for in SLICE_S steps (`_interruptible`), so a
  signal ends it at once, in any thread;
- huggingface_hub's own side files under HF_HOME (the agent registry, telemetry) are switched off
  (`no_side_files`, which lists what it may still touch);
- a listing's next-page link that comes back, or more than MAX_PAGES pages, stops the listing;
- identifiers huggingface_hub turns into cache paths are checked before it sees them: commit ids
  (X-Repo-Commit, model info `sha`) are 40 hex digits, ETags and file names are plain names, and none
  holds a token; model info must be what the typed reader (`model_info_fields`) accepts;
- no transfer leaves through hf_xet (its own client, outside this guard): files come over plain HTTP.

Anything else ends in one HubError line naming the URL (never its user:password) and what to do.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import zlib
from dataclasses import dataclass
from importlib.metadata import version
from urllib.parse import unquote, urlsplit

from ..confined_reader import safe_name
from ..errors import DflashError, HubError
from ..inputs import parse_json
from ..environment import check_flags
from ..secrets import TOKEN_ENV, check_endpoint_credentials, hub_token, register, scrub
from ..signals import on_terminate
from .names import COMMIT

log = logging.getLogger(__name__)

TIMEOUT_ENV = "DFLASH_GGUF_HUB_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0
MIN_RATE = 16 << 10         # bytes a second a body must average once its first deadline has passed
SLICE_S = 0.25              # a blocked read wakes this often to see the deadline and a signal
API_BODY_LIMIT = 32 << 20   # an API answer (model info, a tree listing page), decompressed
RETRY_LIMIT = 3             # answers asking to be retried (429, 5xx), per command
RETRYABLE = (408, 429, 500, 502, 503, 504)
MAX_PAGES = 10_000
_ETAG = re.compile(r"[A-Za-z0-9_-]{1,128}")
_DIGITS = re.compile(r"[0-9]{1,16}")
# huggingface_hub's integer settings, parsed when it is imported (a traceback there otherwise)
_INT_SETTINGS = ("HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT")
_HEADER_SETTINGS = ("HF_HUB_USER_AGENT_ORIGIN",)  # sent as part of a header


# ---------------------------------------------------------------------------------------------------
# The environment huggingface_hub reads when imported
# ---------------------------------------------------------------------------------------------------

def check_environment(environ=os.environ) -> None:
    """The Hub settings of the environment, checked before huggingface_hub reads them: one HubError line
    naming the variable otherwise (huggingface_hub would raise a traceback or send a header with a
    line break in it)."""
    endpoint = environ.get("HF_ENDPOINT")
    if endpoint is not None:
        why = None
        if any(ord(c) < 33 or ord(c) == 127 for c in endpoint):
            why = "holds a space, line break or control character"
        elif not endpoint.isascii():
            why = "holds a character outside ASCII, which no request line can carry (write it percent-encoded)"
        else:
            try:
                parts = urlsplit(endpoint)
                parts.port  # noqa: B018 - raises on a port that is not a number
            except ValueError:
                parts, why = None, "is not a URL"
            if parts is not None and (parts.scheme not in ("http", "https") or not parts.hostname):
                why = "is not an http:// or https:// URL"
        if why:
            raise HubError(f"HF_ENDPOINT {why}; set it to the Hub's address, e.g. https://huggingface.co, or unset it")
    for name in _HEADER_SETTINGS:
        value = environ.get(name)
        if value is not None and not all(" " <= c <= "~" for c in value):
            raise HubError(f"{name} holds a character outside printable ASCII, which no HTTP header can carry; "
                           "use plain ASCII or unset it")
    check_flags(environ)
    check_endpoint_credentials()
    for name in _INT_SETTINGS:
        value = environ.get(name)
        if value is not None and value.strip() and not _DIGITS.fullmatch(value.strip()):
            # scrub's patterns only: the stored token is read through huggingface_hub, not importable yet
            raise HubError(f"{name}={scrub(value, [])[:40]!r} is not a whole number of seconds; set a number or unset it")
    timeout_s()


def timeout_s() -> float:
    """The deadline of one request (DFLASH_GGUF_HUB_TIMEOUT, seconds)."""
    value = os.environ.get(TIMEOUT_ENV, "").strip()
    if not value:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds <= 86400:
        raise HubError(f"{TIMEOUT_ENV}={value[:40]!r} is not a number of seconds from 0 to 86400; set one or unset it")
    return seconds


# ---------------------------------------------------------------------------------------------------
# Identifiers and model info: the typed reader for what huggingface_hub would make paths of
# ---------------------------------------------------------------------------------------------------

def shown_url(url) -> str:
    """A URL as a message shows it: no user:password, no query."""
    parts = urlsplit(str(url))
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _no_secret(value: str, where: str, what: str) -> str:
    if scrub(value) != value:
        raise HubError(f"{where}: the server's {what} holds a token; nothing secret becomes a file or folder name")
    return value


def commit_id(value, where: str, what: str = "commit id") -> str:
    """A commit id as the Hub gives it: exactly 40 lower-case hex digits (never a path, never a token)."""
    if not isinstance(value, str) or not COMMIT.fullmatch(value):
        text = scrub(repr(value))
        raise HubError(f"{where}: the server's {what} {text[:60]} is not a commit id (40 hex digits); the server is "
                       "not a Hugging Face Hub, or is broken: check HF_ENDPOINT")
    return _no_secret(value, where, what)


def file_name(value, where: str, what: str = "file name") -> str:
    """A repository file name, checked before anything is made of it: a plain relative POSIX path."""
    try:
        name = safe_name(value, where, what)
    except DflashError as err:
        raise HubError(scrub(str(err))) from None
    return _no_secret(name, where, what)


def etag(value: str, where: str) -> str:
    normalized = re.sub(r"^W/", "", value.strip()).strip('"')
    if not _ETAG.fullmatch(normalized):
        raise HubError(f"{where}: the server's ETag {scrub(repr(value))[:60]} is not a plain name; huggingface_hub "
                       "would make a cache file of it: check HF_ENDPOINT")
    return _no_secret(normalized, where, "ETag")


@dataclass(frozen=True)
class ModelInfo:
    """What the project reads of a repository's model info: its id, commit and file names."""

    id: str
    sha: str
    files: tuple[str, ...]
    gated: object = False


def model_info_fields(payload, where: str) -> ModelInfo:
    """Model info (`/api/models/O/N/revision/R`) through the typed reader; one HubError line otherwise."""
    if not isinstance(payload, dict):
        raise HubError(f"{where}: the model info is not a JSON object; check HF_ENDPOINT")
    repo_id = payload.get("id", payload.get("modelId"))
    if not isinstance(repo_id, str) or not repo_id or len(repo_id) > 200:
        raise HubError(f"{where}: the model info has no repository id ('id'); check HF_ENDPOINT")
    sha = commit_id(payload.get("sha"), where, "model info 'sha'")
    siblings = payload.get("siblings", [])
    if siblings is None:
        siblings = []
    if not isinstance(siblings, list) or len(siblings) > 1 << 20:
        raise HubError(f"{where}: the model info's 'siblings' is not a list of files; check HF_ENDPOINT")
    files = []
    for i, entry in enumerate(siblings):
        if not isinstance(entry, dict):
            raise HubError(f"{where}: the model info's siblings[{i}] is not an object with an 'rfilename'")
        files.append(file_name(entry.get("rfilename"), where, f"siblings[{i}].rfilename"))
    return ModelInfo(repo_id, sha, tuple(files), payload.get("gated", False))


def read_model_info(body: bytes, where: str) -> ModelInfo:
    """Model info from the bytes of its answer (bounded by the transport), parsed with the JSON limits."""
    return model_info_fields(_json(body, where), where)


def file_names(names, where: object) -> list[str]:
    """Repository file names (from a listing or an index) checked before huggingface_hub is asked for them."""
    return [file_name(name, str(where)) for name in names]


def tree_sizes(payload, where: str) -> dict[str, int]:
    """A parsed tree listing or paths-info answer (or the listing cached in trees/): a list of entries
    whose paths, ids and sizes are checked. Each file's size, by path."""
    sizes = {}
    if not isinstance(payload, list):
        raise HubError(f"{where}: the file listing is not a JSON list; check HF_ENDPOINT")
    for i, entry in enumerate(payload):
        if not isinstance(entry, dict):
            raise HubError(f"{where}: the file listing's entry {i} is not an object")
        path = file_name(entry.get("path"), where, f"listing entry {i} path")
        lfs = entry.get("lfs")
        if isinstance(lfs, dict) and lfs.get("oid") is not None:
            oid = lfs["oid"]
            if not isinstance(oid, str) or not re.fullmatch(r"[0-9a-f]{64}", oid):
                raise HubError(f"{where}: listing entry {i} has an LFS oid that is not a sha256")
        size = entry.get("size")
        if entry.get("type") == "file" and size is not None:
            if type(size) is not int or not 0 <= size < 1 << 50:
                raise HubError(f"{where}: listing entry {i} ({path}) has a size that is not a number of bytes")
            sizes[path] = size
    return sizes


def read_tree(body: bytes, where: str) -> dict[str, int]:
    """A file listing answer through the JSON limits and the typed reader: each file's size, by path."""
    return tree_sizes(_json(body, where), where)


_MODEL_INFO = re.compile(r"/api/models/[^/]+/[^/]+(?:/revision/.+)?")
_TREE = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)/(?:tree|paths-info)/(?P<rev>[^/]+)(?:/.*)?")


def _checked_api(path: str) -> bool:
    return bool(_MODEL_INFO.fullmatch(path) or _TREE.fullmatch(path))


def check_api_answer(path: str, body: bytes, where: str) -> dict[str, int] | None:
    """The identifiers of an API answer huggingface_hub makes paths of, checked by the typed readers;
    for a file listing, each file's size by path."""
    if _MODEL_INFO.fullmatch(path):
        read_model_info(body, where)
    elif _TREE.fullmatch(path):
        return read_tree(body, where)
    return None


def _json(body: bytes, where: str):
    try:
        return parse_json(body, where)
    except DflashError as err:
        raise HubError(f"{scrub(str(err))}; the server is not a Hugging Face Hub, or is broken: check HF_ENDPOINT") \
            from None


# ---------------------------------------------------------------------------------------------------
# Sizes announced: a file's body is read up to what the Hub said it holds, never beyond
# ---------------------------------------------------------------------------------------------------

_RESOLVE = re.compile(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)")
# The ETags of an empty file: its git blob id and its sha256 (an LFS file's)
_EMPTY_ETAGS = ("e69de29bb2d1d6434b8b29ae775ad8c2e48c5391",
                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")


class _Announced:
    """The size the Hub announced for each file this command fetches (a process runs one command): its
    file listing's, else the first answer about the file that gives one (X-Linked-Size, or the
    Content-Length of a whole file), carried across redirects to where the file is read from. Any
    later answer announcing another size is refused, a body is read up to the size and not one byte
    beyond, and one that ends short fails huggingface_hub's own size check: so no blob unlike the
    announcement (nor an empty one whose ETag names content) is ever moved into the cache."""

    def __init__(self):
        self.lock = threading.Lock()
        self.listed: dict[tuple[str, str, str], int] = {}
        self.urls: dict[str, tuple[str, int | None]] = {}  # URL -> (the file, its size when known)

    def listing(self, path: str, sizes: dict[str, int]) -> None:
        m = _TREE.fullmatch(path)
        if m and sizes:
            rev = unquote(m["rev"])
            with self.lock:
                self.listed.update({(m["repo"], rev, name): size for name, size in sizes.items()})

    def body_limit(self, request, response, where: str) -> tuple[str, int] | None:
        """(the file, the most bytes its body may hold) for an answer about a file; refused in one line
        when it announces another size than the Hub did. None for anything else."""
        url = str(request.url)
        m = _RESOLVE.fullmatch(urlsplit(url).path)
        with self.lock:
            name, size = self.urls.get(url, (None, None))
            if m:
                name = unquote(m["path"])
                size = self.listed.get((m["repo"], unquote(m["rev"]), name), size)
        if name is None:
            return None
        headers, status = response.headers, response.status_code
        said = headers.get("X-Linked-Size") or (headers.get("Content-Length") if status == 200 else None)
        if said is not None:
            said = int(said)  # digits: checked with the other headers
            if size is not None and said != size:
                raise HubError(f"{where}: the server announces {said} bytes for {name}, where the Hub announced "
                               f"{size}; it is not read: check HF_ENDPOINT")
            size = said
        tag = (headers.get("X-Linked-ETag") or headers.get("ETag") or "").strip().removeprefix("W/").strip('"')
        if size == 0 and re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", tag) and tag not in _EMPTY_ETAGS:
            raise HubError(f"{where}: the server announces {name} as empty while its ETag names content; it is not "
                           "stored: check HF_ENDPOINT")
        location = headers.get("Location")
        with self.lock:
            self.urls[url] = (name, size)
            if 300 <= status < 400 and location:
                self.urls[str(request.url.join(location))] = (name, size)
        if request.method == "HEAD" or size is None:
            return None
        if status == 206:
            return name, _range_length(request.headers.get("Range", ""), size)
        return (name, size) if status == 200 else None


def _range_length(asked: str, size: int) -> int:
    """The bytes a `Range: bytes=A-B` (or `A-`) asks of a file of `size` bytes."""
    m = re.fullmatch(r"bytes=(\d+)-(\d*)", asked.strip())
    if not m:
        return size
    end = min(int(m[2]) + 1, size) if m[2] else size
    return max(0, end - int(m[1]))


# ---------------------------------------------------------------------------------------------------
# Deadlines, at the socket: every read and write of a request waits at most until its deadline
# ---------------------------------------------------------------------------------------------------

_stopping = threading.Event()
_current = threading.local()


def stop() -> None:
    """Make every request in flight, in every thread, end within SLICE_S (called on SIGINT, SIGTERM, SIGHUP)."""
    _stopping.set()


class _Clock:
    """Time against bytes: `timeout` seconds, plus a second for every MIN_RATE bytes received."""

    def __init__(self, timeout: float):
        self.timeout, self.start, self.received = timeout, time.monotonic(), 0

    def remaining(self) -> float:
        return self.start + self.timeout + self.received / MIN_RATE - time.monotonic()


class _CommandClock(_Clock):
    """The clock of a command's Hub traffic: it runs only while a request is in flight, so time spent
    between requests (converting, validating; a library caller's own work between calls) is not Hub
    traffic taking too long."""

    def __init__(self, timeout: float):
        super().__init__(timeout)
        self.active, self.idle_since = 0, None

    def begin(self) -> None:
        with _command_lock:
            if self.active == 0 and self.idle_since is not None:
                self.start += time.monotonic() - self.idle_since
            self.active += 1

    def end(self) -> None:
        with _command_lock:
            self.active -= 1
            if self.active == 0:
                self.idle_since = time.monotonic()


class _Deadline(_Clock):
    """A request's deadline: its answer starts within `timeout`, its body averages MIN_RATE bytes a
    second, it is never silent for `timeout`, and the command's Hub traffic is within its own clock
    (`finish`, once, when the request is done with)."""

    def __init__(self, url: str, timeout: float):
        super().__init__(timeout)
        self.url, self.last, self.finished = url, self.start, False
        _command_clock().begin()

    def finish(self) -> None:
        if not self.finished:
            self.finished = True
            _command_clock().end()

    def got(self, n: int) -> None:
        self.received += n
        _command_clock().received += n

    def heard(self) -> None:
        self.last = time.monotonic()

    def remaining(self) -> float:
        command = _command_clock().remaining()
        if command <= 0:
            raise HubError(f"{self.url}: this command's Hub traffic has taken over {COMMAND_TIMEOUTS} times "
                           f"{self.timeout:g} s ({TIMEOUT_ENV}) without data flowing; try again later")
        return min(super().remaining(), self.last + self.timeout - time.monotonic(), command)

    def expired(self) -> HubError:
        return HubError(f"{self.url}: no complete answer within {self.timeout:g} s ({TIMEOUT_ENV}); the server "
                        "is not answering or answers too slowly: try again later, or raise the deadline")


COMMAND_TIMEOUTS = 10  # a command's Hub traffic: this many request deadlines, plus its bytes at MIN_RATE
_command: list[_CommandClock] = []
_command_lock = threading.Lock()


def _command_clock() -> _CommandClock:
    """The clock of this command's Hub traffic (a process runs one command), started at its first request."""
    if not _command:
        _command.append(_CommandClock(COMMAND_TIMEOUTS * timeout_s()))
    return _command[0]


def _clamp(timeout: float | None) -> float | None:
    deadline = getattr(_current, "deadline", None)
    if _stopping.is_set():
        raise HubError("stopped while waiting for the Hub")
    if deadline is None:
        return timeout
    left = deadline.remaining()
    if left <= 0:
        raise deadline.expired()
    return left if timeout is None else min(timeout, left)


def _interruptible(connect):
    """`connect()` (a name lookup, a TCP connect or a TLS handshake: one blocking call that neither a
    signal nor `stop()` reaches in a worker thread) run in a helper thread and waited for in SLICE_S
    steps, so that the deadline and a stop end the wait at once; a connection that completes after the
    wait was given up is closed by the helper."""
    lock, done, box = threading.Lock(), threading.Event(), {}

    def run() -> None:
        try:
            box["stream"] = connect()
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = err
        with lock:
            done.set()
            abandoned = box.get("abandoned", False)
        if abandoned and "stream" in box:
            box["stream"].close()

    threading.Thread(target=run, name="hub-connect", daemon=True).start()
    try:
        while not done.wait(SLICE_S):
            _clamp(None)  # raises once stopped or past the deadline
    except BaseException:
        with lock:
            box["abandoned"] = True
            finished = done.is_set()
        if finished and "stream" in box:
            box["stream"].close()
        raise
    if "error" in box:
        raise box["error"]
    return box["stream"]


def _make_backend():
    # startup: only commands that reach the Hub load the HTTP stack
    import httpcore2

    class Stream(httpcore2.NetworkStream):
        def __init__(self, inner):
            self._inner = inner

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            waited = 0.0
            while True:  # in slices, so that the deadline and a stop are seen while the server is silent
                left = _clamp(timeout if timeout is None else timeout - waited)
                step = SLICE_S if left is None else min(SLICE_S, left)
                try:
                    data = self._inner.read(max_bytes, step)
                    deadline = getattr(_current, "deadline", None)
                    if deadline is not None:
                        deadline.heard()
                    return data
                except httpcore2.ReadTimeout:
                    waited += step
                    if timeout is not None and waited >= timeout:
                        raise

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self._inner.write(buffer, _clamp(timeout))

        def close(self) -> None:
            self._inner.close()

        def start_tls(self, ssl_context, server_hostname=None, timeout=None):
            limit = _clamp(timeout)
            return Stream(_interruptible(lambda: self._inner.start_tls(ssl_context, server_hostname, limit)))

        def get_extra_info(self, info: str):
            return self._inner.get_extra_info(info)

    class Backend(httpcore2.NetworkBackend):
        def __init__(self, inner):
            self._inner = inner

        def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
            limit = _clamp(timeout)
            return Stream(_interruptible(lambda: self._inner.connect_tcp(host, port, limit, local_address,
                                                                         socket_options)))

        def connect_unix_socket(self, path, timeout=None, socket_options=None):
            limit = _clamp(timeout)
            return Stream(_interruptible(lambda: self._inner.connect_unix_socket(path, limit, socket_options)))

        def sleep(self, seconds: float) -> None:
            self._inner.sleep(seconds)

    return Backend


# ---------------------------------------------------------------------------------------------------
# The transport
# ---------------------------------------------------------------------------------------------------

def _origin(url) -> tuple[str, str, int | None]:
    parts = urlsplit(str(url))
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


_KEEPS_BODY = (307, 308)  # a redirect that re-sends the request's body (httpx turns the others into a GET)


def _check_redirect(request, response, where: str) -> None:
    """A request with a body (the OIDC exchange's id token, a commit) is never re-sent to another host."""
    location = response.headers.get("Location")
    if response.status_code not in _KEEPS_BODY or not location or request.method in ("GET", "HEAD"):
        return
    try:
        target = request.url.join(location)
    except Exception:  # httpx raises its own errors for a Location that is not a URL  # noqa: BLE001
        target = None
    if target is None or _origin(target) != _origin(request.url):
        raise HubError(f"{where}: the server redirects this {request.method} (and its body) to another host "
                       f"({scrub(location)[:80]!r}); it is not re-sent: check HF_ENDPOINT")


def _ci_minting(request) -> bool:
    """GitHub's id-token request of the OIDC exchange (huggingface_hub's _oidc.py): its own bearer token
    goes to its own URL, and only there."""
    url, token = os.environ.get("ACTIONS_ID_TOKEN_REQUEST_URL"), os.environ.get("ACTIONS_ID_TOKEN_REQUEST_TOKEN")
    if not (url and token and os.environ.get("HF_OIDC_RESOURCE")):
        return False
    same = _origin(request.url) == _origin(url) and request.url.path == urlsplit(url).path
    return same and request.headers.get("Authorization") == f"Bearer {token}"


class _Budget:
    """What one command may spend on retries and listing pages (a process runs one command)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.retryable = 0
        self.pages: set[str] = set()


def _make_transport(endpoint: str):
    # startup: only commands that reach the Hub load the HTTP stack
    import httpx2

    backend_class = _make_backend()
    home = _origin(endpoint)
    budget = _Budget()
    announced = _Announced()

    class _Body(httpx2.SyncByteStream):
        """A response body read within its deadline and limit, gzip/deflate decoded here (bounded)."""

        def __init__(self, inner, deadline: _Deadline, encoding: str, limit: int | None, where: str,
                     file: tuple[str, int] | None = None):
            self._inner, self._deadline, self._limit, self._where = inner, deadline, limit, where
            self._file = file  # (a file's name, the bytes announced for it): not one byte more is read
            self._decoder = None
            if encoding in ("gzip", "deflate"):
                self._decoder = zlib.decompressobj(zlib.MAX_WBITS | 32 if encoding == "gzip" else zlib.MAX_WBITS)

        def __iter__(self):
            out = received = 0
            for chunk in self._inner:
                self._deadline.got(len(chunk))
                received += len(chunk)
                if self._file is not None and received > self._file[1]:
                    raise HubError(f"{self._where}: the server sent more than the {self._file[1]} bytes announced "
                                   f"for {self._file[0]}; it is not stored: check HF_ENDPOINT")
                if self._decoder is not None:
                    chunk = self._decoder.decompress(chunk, self._limit - out + 1)  # API answers only
                out += len(chunk)
                if self._limit is not None and out > self._limit:
                    raise HubError(f"{self._where}: the answer is over the {self._limit >> 20} MiB an API answer may "
                                   "be (decompressed); the server is broken: check HF_ENDPOINT")
                if chunk:
                    yield chunk

        def close(self) -> None:
            try:
                self._inner.close()
            finally:
                self._deadline.finish()

    class GuardedTransport(httpx2.BaseTransport):
        def __init__(self, inner: httpx2.HTTPTransport):
            self._inner = inner
            pool = private_hooks(inner)
            pool._network_backend = backend_class(pool._network_backend)

        def handle_request(self, request: httpx2.Request) -> httpx2.Response:
            where = shown_url(request.url)
            if _origin(request.url) != home and not _ci_minting(request):
                request.headers.pop("Authorization", None)  # the token is the endpoint's alone
            api = urlsplit(str(request.url)).path.startswith(("/api/", "/oauth/"))
            # an API answer may come compressed (decoded by _Body, bounded); a file comes as it is
            request.headers["Accept-Encoding"] = "gzip, deflate" if api else "identity"
            deadline = _Deadline(where, timeout_s())
            _current.deadline = deadline
            try:
                response = self._inner.handle_request(request)
            except BaseException:
                deadline.finish()
                raise
            try:
                self._check_headers(response, where)
                _check_redirect(request, response, where)
                retry = self._retry(response, where)
                self._check_next_page(response, request.url, where)
                encoding = response.headers.get("Content-Encoding", "identity").strip().lower() or "identity"
                if encoding != "identity" and (not api or encoding not in ("gzip", "deflate")):
                    raise HubError(f"{where}: the server sent a {encoding[:20]!r}-encoded body where none was "
                                   "asked; the file is not read: check HF_ENDPOINT")
                limit = API_BODY_LIMIT if api else None
                declared = response.headers.get("Content-Length")
                if limit is not None and encoding == "identity" and declared and int(declared) > limit:
                    raise HubError(f"{where}: the server announces a {declared}-byte answer, over the "
                                   f"{limit >> 20} MiB an API answer may be")
                file = announced.body_limit(request, response, where)  # None: not a file's answer
                body = _Body(response.stream, deadline, encoding, limit, where, file)
                headers = [(k, v) for k, v in response.headers.multi_items()
                           if encoding == "identity" or k.lower() not in ("content-encoding", "content-length")]
                if retry:
                    headers = [(k, v) for k, v in headers if k.lower() not in ("retry-after", "ratelimit",
                                                                               "ratelimit-policy")]
                    headers.append(("Retry-After", "0"))
                path = urlsplit(str(request.url)).path
                if api and response.status_code < 300 and _checked_api(path):
                    try:
                        content = b"".join(body)
                    finally:
                        body.close()
                    announced.listing(path, check_api_answer(path, content, where) or {})
                    return httpx2.Response(response.status_code, headers=headers, content=content,
                                           extensions=response.extensions)
                return httpx2.Response(response.status_code, headers=headers, stream=body,
                                       extensions=response.extensions)
            except BaseException:
                response.close()
                deadline.finish()
                raise

        def _check_headers(self, response, where: str) -> None:
            for name, value in response.headers.raw:
                if not (name + value).isascii():  # the rebuilt response could not carry it
                    shown_name = name.decode("ascii", "backslashreplace")[:60]
                    raise HubError(f"{where}: the server's {shown_name} header holds a byte above 0x7f, which no "
                                   "HTTP header may carry; the server is broken: check HF_ENDPOINT")
            commit = response.headers.get("X-Repo-Commit")
            if commit is not None:
                commit_id(commit.strip(), where, "X-Repo-Commit header")
            for name in ("ETag", "X-Linked-ETag"):
                value = response.headers.get(name)
                if value is not None:
                    etag(value, where)
            for name in ("X-Linked-Size", "Content-Length"):
                value = response.headers.get(name)
                if value is not None and not _DIGITS.fullmatch(value.strip()):
                    raise HubError(f"{where}: the server's {name} {scrub(value)[:40]!r} is not a size in bytes")

        def _retry(self, response, where: str) -> bool:
            """Whether huggingface_hub will retry this answer; refused once the command's budget is spent."""
            if response.status_code not in RETRYABLE:
                return False
            with budget.lock:
                budget.retryable += 1
                spent = budget.retryable > RETRY_LIMIT
            if spent:
                raise HubError(f"{where}: the server answered HTTP {response.status_code} {budget.retryable} times "
                               "(busy or failing); try again later")
            return True

        def _check_next_page(self, response, url, where: str) -> None:
            link = response.headers.get("Link")
            if not link or 'rel="next"' not in link.replace("'", '"'):
                return
            nxt = httpx2.Response(200, headers={"Link": link}).links.get("next", {}).get("url")
            if not nxt:
                return
            nxt = str(httpx2.URL(str(url)).join(nxt))
            with budget.lock:
                budget.pages.add(str(url))
                looped = nxt in budget.pages
                too_many = len(budget.pages) > MAX_PAGES
            if looped or too_many:
                why = "leads back to a page already read" if looped else f"goes past {MAX_PAGES} pages"
                raise HubError(f"{where}: the listing's next-page link {why}; the server is broken: check HF_ENDPOINT")

        def close(self) -> None:
            self._inner.close()

    return GuardedTransport


def private_hooks(transport):
    """The connection pool of an httpx2 transport, whose network backend the guard wraps: httpx2 builds
    the pool itself and offers no public way in, and the backend is the only place a deadline reaches a
    read that never returns (httpx's own timeouts are per read, not per request). Checked, so that an
    httpx2 without these internals (or without get_environment_proxies) is one line, not a traceback;
    tests/hub/test_hub.py checks the installed version has them."""
    # startup: only commands that reach the Hub load the HTTP stack
    import httpx2._utils

    pool = getattr(transport, "_pool", None)
    if not hasattr(pool, "_network_backend") or not hasattr(httpx2._utils, "get_environment_proxies"):

        raise DflashError(f"httpx2 {version('httpx2')} lacks the internals the Hub guard needs (a transport's "
                          "_pool._network_backend, _utils.get_environment_proxies); install the httpx2 that "
                          "huggingface_hub 2.4 was released with, or report this")
    return pool


def _proxy_mounts(transport_class) -> dict:
    """The proxies of the environment (HTTPS_PROXY, NO_PROXY...), each behind the guard, as httpx would
    mount them itself for a client without a transport of its own."""
    # startup: only commands that reach the Hub load the HTTP stack
    import httpx2
    from httpx2._utils import get_environment_proxies

    return {pattern: None if url is None else transport_class(httpx2.HTTPTransport(proxy=url))
            for pattern, url in get_environment_proxies().items()}


def no_side_files(constants) -> None:
    """huggingface_hub's side files under HF_HOME, switched off for this process: the one place that says
    which files of its own the library may touch.

    - `.agent_harnesses.json` (the agent registry, read and rewritten whenever telemetry is on, and
      fetched from the endpoint once a day): never read, written or fetched. The registry is set empty
      in-process, so detection finds nothing without opening the file (a FIFO there would block every
      command, a link to /dev/zero fill memory, and what a hostile endpoint served would be trusted for
      a day); telemetry (the torch version and agent in the user agent) is off.
    - `.check_for_update_done`, `.check_for_skill_update_done`: the `hf` command line's, never touched.
    - The token files (`token`, `stored_tokens`): read once by secrets.hub_token, as untrusted local state,
      and handed over as HF_TOKEN, which huggingface_hub reads first.
    - The cache (HF_HUB_CACHE): what it reads there is checked first (hub/cache.py); what it writes is
      checked against what the Hub announced (the transport's announced sizes).
    """
    constants.HF_HUB_DISABLE_TELEMETRY = True
    constants.HF_HUB_DISABLE_UPDATE_CHECK = True
    # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
    from huggingface_hub.utils import _detect_agent

    # The registry huggingface_hub itself falls back to when none can be had: no harness, no file read.
    # tests/hub/test_hub_side_files.py checks the installed version has these names.
    _detect_agent._registry = _detect_agent._EMPTY_REGISTRY


_installed = False


def _resolve_token() -> None:
    """huggingface_hub reads the stored login itself (a FIFO there would block it forever): read it here
    as untrusted local state (secrets.hub_token) and hand it over as HF_TOKEN, which it reads first."""

    token = hub_token()
    if token and not any(os.environ.get(name, "").strip() for name in TOKEN_ENV):
        os.environ["HF_TOKEN"] = token


def install() -> None:
    """Check the Hub settings, then make huggingface_hub's shared client the guarded one (once)."""
    global _installed
    check_environment()
    if _installed:
        return
    # startup: only commands that reach the Hub load the HTTP stack
    import httpx2
    # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
    from huggingface_hub import constants, set_client_factory
    from huggingface_hub.utils import logging as hf_logging
    # huggingface_hub's own request hook (offline mode, request ids), as its default client has it
    # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
    from huggingface_hub.utils._http import hf_request_event_hook

    # Xet transfers go through hf_xet's own HTTP client (to a storage host a server names, with a token
    # it hands out) and into a blob store keyed by a hash the server gives: none of it passes the guard.
    # Plain HTTP download and LFS upload, which every Hub still serves, do.
    constants.HF_HUB_DISABLE_XET = True
    no_side_files(constants)
    transport_class = _make_transport(constants.ENDPOINT)

    def client() -> httpx2.Client:
        return httpx2.Client(event_hooks={"request": [hf_request_event_hook]}, follow_redirects=True,
                             timeout=None, transport=transport_class(httpx2.HTTPTransport()),
                             mounts=_proxy_mounts(transport_class))

    set_client_factory(client)
    _resolve_token()
    on_terminate(stop)
    _route_library_logs(hf_logging.get_logger("huggingface_hub"))
    _exchange_oidc(constants)
    _installed = True


def _exchange_oidc(constants) -> None:
    """With HF_OIDC_RESOURCE set, huggingface_hub trades the CI's id token for an access token at its first
    request, through the shared (guarded) client, and sends that token from then on: trade it here,
    first, so that the filter knows the token before anything can print it."""
    if not os.environ.get("HF_OIDC_RESOURCE") or constants.is_offline_mode():
        return
    # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
    from huggingface_hub import get_token
    from huggingface_hub.errors import HfHubHTTPError, OIDCError

    try:
        token = get_token()
    except (OIDCError, HfHubHTTPError, ValueError, KeyError, TypeError) as err:
        raise HubError(f"HF_OIDC_RESOURCE: the OIDC token exchange failed ({scrub(str(err))[:300]}); check "
                       "HF_OIDC_RESOURCE, HF_OIDC_ID_TOKEN and HF_ENDPOINT") from None
    if not isinstance(token, str):
        raise HubError("HF_OIDC_RESOURCE: the OIDC token exchange answered no access token; check HF_ENDPOINT")
    register(token, "HF_OIDC_RESOURCE: the access token the OIDC exchange answered")


def _route_library_logs(library: logging.Logger) -> None:
    """huggingface_hub's records through the program's own handler (the secret filter, one format)
    instead of the stderr handler it adds itself; its retry notices only under -v or HF_HUB_VERBOSITY
    (the guard bounds the retries, and the command's error line says what failed)."""
    for handler in list(library.handlers):
        library.removeHandler(handler)
    library.propagate = True
    if not os.environ.get("HF_HUB_VERBOSITY") and logging.getLogger().getEffectiveLevel() > logging.INFO:
        library.setLevel(logging.ERROR)
