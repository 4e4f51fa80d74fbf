"""Models named by their Hugging Face Hub repo id.

Wherever a command takes a checkpoint or target folder, or a target GGUF, it also takes

    owner/name[@revision]                   a repository at a branch, tag or commit (default: main)
    owner/name[@revision]:QUANT             the GGUF of that quantization in a GGUF repository
    owner/name[@revision]/path/file.gguf    one GGUF file of a repository

and a local path that exists always wins over a repo id. Files go through huggingface_hub: its
cache, resumed downloads, HF_HUB_OFFLINE=1 (from the cache only), HF_TOKEN or the stored login, and
HF_ENDPOINT (a mirror of the Hub, such as olah, works: model info is always asked at a revision,
and a server that ignores byte ranges is read as a stream; the provenance names the endpoint read).
Only the files a command reads are fetched (the drafter's config, weights, index and card; the
target's config, tokenizer and card). A target GGUF that is not in the cache already is
not downloaded: its header and metadata are read in place by HTTP range requests.

Every Hub failure becomes one HubError line naming the repository and what to do.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from ..confined_reader import find_in, open_in, safe_name
from ..errors import DflashError, HubError
from ..gguf.checkpoint import INDEX_NAME, MASK_EMBEDDING_NAME
from ..gguf.reader import GGUFFile
from ..licenses import LICENSE_FILE_NAMES
from . import cache as hub_cache
from . import transport as hub_transport
from . import names as hub_names
from .names import is_repo_id, is_revision

log = logging.getLogger(__name__)

# A drafter's files besides its weights: config, index, mask embedding (refused by the converter, so it
# must be seen), and the card and license files a release reads and copies.
DRAFTER_FILES = ("config.json", INDEX_NAME, "README.md", MASK_EMBEDDING_NAME, *LICENSE_FILE_NAMES)
# What the tokenizer metadata is made from (hf_vocab.py with gguf-py's SpecialVocab).
TARGET_READ_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                     "special_tokens_map.json", "chat_template.json", "chat_template.jinja")
TARGET_FILES = (*TARGET_READ_FILES, "README.md", *LICENSE_FILE_NAMES)
# Prefixes of files that ride along in a GGUF repository without being the model (llama.cpp's -hf).
SIDECAR_PREFIXES = ("dflash-", "dspark-", "eagle3-", "mtp-", "mmproj")

# the shape only; hub_names says which repo ids and revisions the Hub accepts
_REF = re.compile(r"^(?P<repo>[^/@:]+/[^/@:]+)(?:@(?P<rev>refs/pr/\d+|[^/@:]+))?"
                  r"(?::(?P<quant>[A-Za-z0-9_.-]+)|/(?P<path>[^@:]+\.gguf))?$")
_COMMIT = hub_names.COMMIT
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class HubRef:
    """A model named on the Hub: a repository, maybe a revision, maybe one GGUF (by quant or path)."""

    repo: str
    revision: str | None = None
    quant: str | None = None
    path: str | None = None

    @property
    def is_gguf(self) -> bool:
        return self.quant is not None or self.path is not None

    def __str__(self) -> str:
        text = self.repo + (f"@{self.revision}" if self.revision else "")
        return text + (f":{self.quant}" if self.quant else f"/{self.path}" if self.path else "")


def parse_ref(text: str) -> HubRef | None:
    m = _REF.fullmatch(str(text).strip(" "))  # fullmatch: `$` alone would take "owner/name\n"
    if not m or not is_repo_id(m.group("repo")) or (m.group("path") and ".." in m.group("path").split("/")):
        return None
    if m.group("rev") is not None and not is_revision(m.group("rev")):
        return None
    if m.group("repo").lower().endswith(".gguf"):
        return None  # a GGUF path that does not exist, not a repository
    return HubRef(m.group("repo"), m.group("rev"), m.group("quant"), m.group("path"))


def as_model(value: str | os.PathLike | HubRef) -> Path | HubRef:
    """A local path when one exists at `value`, else the repo id it spells, else the (missing) path."""
    if isinstance(value, HubRef):
        return value
    path = Path(value)
    if path.exists():
        return path
    return parse_ref(str(value)) or path


def hub_endpoint() -> str:
    """The Hub this process talks to (HF_ENDPOINT, else the public Hub), without any user:password."""
    hub_transport.install()
    # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
    from huggingface_hub import constants

    parts = urlsplit(constants.ENDPOINT.rstrip("/"))
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


@dataclass(frozen=True)
class HubSource:
    """Where a model came from on the Hub: the repository and the exact commit."""

    repo: str
    revision: str          # the commit sha
    file: str | None = None  # the file read, for a single GGUF
    sha256: str | None = None  # that file's sha256 as the Hub declares it (LFS files)
    endpoint: str = field(default_factory=hub_endpoint)  # the public Hub or the mirror read from

    @property
    def url(self) -> str:
        return f"{self.endpoint}/{self.repo}"


def cache_source(path: str | os.PathLike) -> HubSource | None:
    """The repository and commit of a path inside huggingface_hub's cache
    (.../models--owner--name/snapshots/<sha>[/file]); None elsewhere."""
    parts = Path(os.path.abspath(path)).parts
    for i, part in enumerate(parts[:-2]):
        if part.startswith("models--") and part.count("--") >= 2 and parts[i + 1] == "snapshots":
            repo = part[len("models--"):].replace("--", "/", 1)
            sha = parts[i + 2]
            if _COMMIT.fullmatch(sha):
                rest = "/".join(parts[i + 3:]) or None
                return HubSource(repo, sha, rest if rest and rest.endswith(".gguf") else None)
    return None


def folder_name(folder: str | os.PathLike) -> str:
    """A model folder's name: the repository's for a cache snapshot (whose own name is a commit sha)."""
    source = cache_source(folder)
    return source.repo.split("/")[-1] if source else Path(folder).resolve().name


# ---------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------

def _offline() -> bool:
    hub_transport.install()
    # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
    from huggingface_hub import constants

    return constants.is_offline_mode()


def _offline_error(ref: HubRef) -> HubError:
    return HubError(f"{ref}: not in the Hugging Face cache and HF_HUB_OFFLINE=1 forbids fetching it; run "
                    "once online (unset HF_HUB_OFFLINE) or give a local path")


@contextmanager
def hub_errors(ref: HubRef):
    """Turn huggingface_hub's and the network's exceptions into one line each, in our words (the
    guarded client installed first: every request inside goes through it)."""
    hub_transport.install()
    try:
        yield
    except DflashError:
        raise
    except Exception as err:
        worded = _worded(ref, err)
        if worded is None:
            raise  # ours: a bug to see, not a Hub error to word
        raise worded from None


def _worded(ref: HubRef, err: Exception) -> HubError | None:
    """The one line for a Hub or network error; None for an exception of another origin."""
    # startup: only commands that reach the Hub load the HTTP stack
    import httpx2
    # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
    from huggingface_hub import errors

    if isinstance(err, errors.GatedRepoError):
        # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
        from huggingface_hub import get_token

        who = "this token has no access" if get_token() else "no token is set"
        return HubError(f"{ref}: gated repository and {who}; accept its terms at {hub_endpoint()}/{ref.repo} "
                        "and set HF_TOKEN (or `hf auth login`)")
    if isinstance(err, errors.RevisionNotFoundError):
        return _revision_error(ref)
    if isinstance(err, errors.RepositoryNotFoundError) or (
            isinstance(err, errors.HfHubHTTPError) and _status(err) in (401, 404) and ref.revision
            and not isinstance(err, errors.RemoteEntryNotFoundError)):
        # A mirror (olah) answers 401 RepoNotFound, or a bare 404, for an unknown revision of a
        # repository it has: ask the default branch to tell the two apart.
        if _pinned(ref) and _exists(ref.repo):
            return _revision_error(ref)
        return HubError(f"{ref}: no such local path, and no repository {ref.repo} on {hub_endpoint()} (a private "
                        "one needs HF_TOKEN)")
    if isinstance(err, errors.RemoteEntryNotFoundError):
        if _pinned(ref) and _exists(ref.repo) and not _exists(ref.repo, ref.revision):
            return _revision_error(ref)  # olah answers EntryNotFound at a commit it does not have
        return HubError(f"{ref}: no such file in {ref.repo}" + (f" at {ref.revision}" if ref.revision else ""))
    if isinstance(err, errors.IncompleteSnapshotError):
        why = "HF_HUB_OFFLINE=1 forbids fetching them" if _offline() else f"{hub_endpoint()} cannot be reached"
        return HubError(f"{ref}: the cached snapshot {err.snapshot_path} lacks files it needs and {why}; run once "
                        "online to complete it")
    if isinstance(err, (errors.OfflineModeIsEnabled, errors.LocalEntryNotFoundError)):
        if _offline():
            return _offline_error(ref)
        if isinstance(err.__cause__, errors.HfHubHTTPError):  # the server answered, and not with the files
            return _worded(ref, err.__cause__)
        cause = err.__cause__ if err.__cause__ is not None else err
        return HubError(f"{ref}: cannot reach {hub_endpoint()} and not in the Hugging Face cache "
                        f"({_first_line(cause)})")
    if isinstance(err, (httpx2.ConnectError, httpx2.TimeoutException)):
        return HubError(f"{ref}: cannot reach {hub_endpoint()} ({_first_line(err)}); check the network, or set "
                        "HF_HUB_OFFLINE=1 to use the cache")
    if isinstance(err, errors.HfHubHTTPError):
        said = f": {_first_line(err.server_message)}" if err.server_message else ""
        return HubError(f"{ref}: {hub_endpoint()} answered HTTP {_status(err)}{said}")
    if type(err).__module__.startswith(("huggingface_hub", "httpx")) or _raised_in_huggingface_hub(err):
        return HubError(f"{ref}: reading it through huggingface_hub failed: {_first_line(err)}")
    return None


def _raised_in_huggingface_hub(err: Exception) -> bool:
    """Whether huggingface_hub itself raised `err` (its ValueErrors for a file name or a pointer path a
    server or the cache gave it): a Hub error, not a bug of ours."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and "huggingface_hub" in Path(tb.tb_frame.f_code.co_filename).parts


def _status(err) -> int | None:
    return getattr(getattr(err, "response", None), "status_code", None)


DEFAULT_REVISION = "main"


def _revision_error(ref: HubRef) -> HubError:
    return HubError(f"{ref}: revision {ref.revision!r} not found in {ref.repo}; give a branch, tag or commit "
                    "that exists")


def _pinned(ref: HubRef) -> bool:
    """Whether `ref` names a revision other than the default branch, and the Hub can be asked about it."""
    return bool(ref.revision) and ref.revision != DEFAULT_REVISION and not _offline()


def _exists(repo: str, revision: str = DEFAULT_REVISION) -> bool:
    """Whether `repo` answers at `revision` (to tell an unknown revision from an unknown repository)."""
    try:
        _fetch_model_info(repo, revision)
    except Exception:  # any failure: the caller's error stands
        return False
    return True


def _fetch_model_info(repo: str, revision: str) -> hub_transport.ModelInfo:
    """`/api/models/O/N/revision/R` (always at a revision: mirrors answer it where the bare form is
    refused), read through the typed reader."""
    # startup: only commands that reach the Hub load the HTTP stack
    import httpx2
    # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_backoff

    url = f"{constants.ENDPOINT}/api/models/{repo}/revision/{quote(revision, safe='')}"
    # a connection refused or a name not resolved is not retried, as downloads do not retry it: no
    # network is one line at once, not after 23 s of backoff
    retried = (httpx2.TimeoutException, httpx2.ReadError, httpx2.WriteError, httpx2.RemoteProtocolError)
    response = http_backoff("GET", url, headers=build_hf_headers(), retry_on_exceptions=retried)
    hf_raise_for_status(response)
    return hub_transport.read_model_info(response.content, hub_transport.shown_url(url))


def model_info(ref: HubRef) -> hub_transport.ModelInfo:
    """The repository's model info at `ref`'s revision, `main` when it names none."""
    with hub_errors(ref):
        return _fetch_model_info(ref.repo, ref.revision or DEFAULT_REVISION)


_CLASS_NAME = re.compile(r"\b(?:[A-Z][a-z0-9]+)+(?:Error|Exception|Enabled)\b:?\s*")


def _first_line(err: Exception | str) -> str:
    """The first line of an error's message, without the exception class names it may quote."""
    text = next((ln.strip() for ln in str(err).splitlines() if ln.strip()), "")
    text = " ".join(_CLASS_NAME.sub("", text).split()).removeprefix("Got: ").strip()
    return text or "no details given"


@contextmanager
def _quiet_progress():
    """huggingface_hub's progress bars only on a terminal (the library does not print otherwise)."""
    # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    if sys.stderr.isatty() or are_progress_bars_disabled():
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()


# ---------------------------------------------------------------------------------------------------
# Folders: a drafter checkpoint, a target's config and tokenizer
# ---------------------------------------------------------------------------------------------------

def _weight_files(folder: Path, ref: HubRef, revision: str) -> list[str]:
    """The safetensors files a checkpoint is read from: the index's shards, else those at the root."""
    if os.path.lexists(folder / INDEX_NAME):
        try:  # the confined reader, as the checkpoint reads it; only plain names are fetched
            weight_map = json.loads(open_in(folder, INDEX_NAME, "index file").read()).get("weight_map") or {}
            return [safe_name(v, INDEX_NAME, "weight_map shard") for v in dict.fromkeys(weight_map.values())]
        except (DflashError, ValueError, AttributeError, TypeError, RecursionError):
            return []  # the checkpoint reader names what is wrong with it
    # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
    from huggingface_hub import get_cached_repo_tree
    from huggingface_hub.errors import CachedRepoTreeNotFoundError

    try:
        listed = [f.path for f in get_cached_repo_tree(ref.repo, revision=revision)]
    except CachedRepoTreeNotFoundError:
        # A cache written file by file (hf_hub_download) or by an older huggingface_hub has no tree
        # listing: offline, the snapshot folder itself says what is there, as
        # snapshot_download(local_files_only=True) trusts it.
        if not _offline():
            raise
        listed = [p.name for p in folder.iterdir()]
    return [name for name in listed if "/" not in name and name.endswith(".safetensors")]


def fetch_folder(ref: HubRef, files: tuple[str, ...], weights: bool = False) -> Path:
    """The repository's snapshot folder in the cache holding `files` (those it has) and, with
    `weights`, its safetensors weights; fetched when missing."""
    # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
    from huggingface_hub import snapshot_download

    if ref.is_gguf:
        raise HubError(f"{ref}: names a GGUF file; a checkpoint is given as a repository (owner/name[@revision])")
    with hub_errors(ref), _quiet_progress():
        hub_cache.check_repo(ref.repo, ref.revision)
        folder = hub_cache.check_snapshot(snapshot_download(ref.repo, revision=ref.revision,
                                                            allow_patterns=list(files)))
        if not (folder / "config.json").is_file():
            raise HubError(f"{ref}: the repository has no config.json; a checkpoint or target folder needs one "
                           "(a GGUF repository is named owner/name:QUANT)")
        if weights:
            shards = _weight_files(folder, ref, folder.name)
            if shards:
                hub_transport.file_names(shards, ref)
                snapshot_download(ref.repo, revision=folder.name, allow_patterns=shards)
    log.info("%s: using %s", ref, folder)
    return folder


def card_folder(repo: str, revision: str | None) -> Path:
    """The repository's card and license files (those it has) in the cache: what a GGUF repository
    declares of its license beside each file's `general.license`."""
    # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
    from huggingface_hub import snapshot_download

    ref = HubRef(repo, revision)
    with hub_errors(ref), _quiet_progress():
        hub_cache.check_repo(repo, revision)
        return hub_cache.check_snapshot(snapshot_download(repo, revision=revision,
                                                          allow_patterns=["README.md", *LICENSE_FILE_NAMES]))


def download_file(repo: str, path: str, revision: str | None = None):
    """One file of a repository, fetched into the cache and opened through the confined reader
    (confine.Opened): a cached file linked out of the cache is refused, not read. huggingface_hub's
    errors are the caller's to word (`hub_errors`), or to expect (a missing card)."""
    # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
    from huggingface_hub import hf_hub_download

    hub_transport.install()
    hub_transport.file_name(path, repo)
    hub_cache.check_repo(repo, revision)
    cached = hf_hub_download(repo, path, revision=revision)
    folder = hub_cache.check_snapshot(Path(cached[:-len(path)]))
    return open_in(folder, path, "cached file")


def drafter_folder(value: str | os.PathLike | HubRef) -> Path:
    """A drafter checkpoint folder: the local path, or the repository's config, weights, index and card."""
    model = as_model(value)
    return model if isinstance(model, Path) else fetch_folder(model, DRAFTER_FILES, weights=True)


def target_folder(value: str | os.PathLike | HubRef, weights: bool = False) -> Path:
    """A target's Hugging Face folder: the local path, or the repository's config, tokenizer and card
    (and weights, for the PyTorch reference)."""
    model = as_model(value)
    return model if isinstance(model, Path) else fetch_folder(model, TARGET_FILES, weights=weights)


# ---------------------------------------------------------------------------------------------------
# A GGUF in a repository, read in place
# ---------------------------------------------------------------------------------------------------

def _quant_pattern(quant: str) -> re.Pattern:
    return re.compile(rf"(?:^|[-._]){re.escape(quant)}(?:[-.]|$)", re.IGNORECASE)


def split_first(name: str) -> bool:
    m = re.search(r"-(\d{5})-of-\d{5}\.gguf$", name)
    return m is None or m.group(1) == "00001"


def pick_gguf(ref: HubRef, files: list[str]) -> str:
    """The file `owner/name:QUANT` means among a repository's files, as llama.cpp's -hf chooses: a
    .gguf whose name carries the quant, not a sidecar (drafter, projector), the first part of a split."""
    ggufs = [f for f in files if f.endswith(".gguf") and not Path(f).name.lower().startswith(SIDECAR_PREFIXES)]
    if ref.path is not None:
        if ref.path not in files:
            raise HubError(f"{ref}: no file {ref.path} in {ref.repo}" + (f"@{ref.revision}" if ref.revision else ""))
        return ref.path
    pattern = _quant_pattern(ref.quant)
    matches = [f for f in ggufs if pattern.search(Path(f).name[:-len(".gguf")] + ".") and split_first(f)]
    if not matches:
        quants = sorted({q for f in ggufs for q in re.findall(
            r"(?:^|[-._])((?:IQ|Q|TQ)\d[A-Z0-9_]*|BF16|F16|F32|MXFP4[A-Z0-9_]*)(?=[-.]|$)",
            Path(f).name[:-len(".gguf")].upper() + ".")})
        have = f"available: {', '.join(quants)}" if quants else "it holds no model GGUF"
        raise HubError(f"{ref}: no GGUF file for quant {ref.quant} in {ref.repo} ({have})")
    if len(matches) > 1:
        exact = [f for f in matches if Path(f).name.upper().endswith(f"-{ref.quant.upper()}.GGUF")]
        matches = exact if len(exact) == 1 else matches
    if len(matches) > 1:
        listed = ", ".join(matches[:4])
        raise HubError(f"{ref}: {len(matches)} files match {ref.quant} ({listed}); name one as "
                       f"{ref.repo}/PATH.gguf")
    return matches[0]


RANGE_RETRIES = 3
RETRY_WAIT_S = 0.5


class HubRangeFile(io.RawIOBase):
    """A file on the Hub read by HTTP range requests (through huggingface_hub's session, token and
    endpoint); `bytes_fetched` counts the body bytes received.

    A server that ignores `Range` (a mirror such as olah answers 200 with the whole body, maybe
    chunked) is read as a stream instead: its answer stays open and each read takes the next bytes
    from it, so a reader moving forward (GGUFFile's prefix) receives only the bytes it asks for; the
    stream is closed by `close()`, without reading the rest of the file."""

    def __init__(self, url: str, size: int, name: str, token: bool = True):
        # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
        from huggingface_hub.utils import build_hf_headers

        self.url, self.size, self.name = url, size, name
        # A CDN location (another origin) gets no token, as huggingface_hub's own downloads do.
        self._headers = build_hf_headers() if token else {}
        self._pos = 0
        self.bytes_fetched = 0
        self.requests = 0
        self.streamed = False  # the server ignored the byte range: read as a stream
        self._stream = None    # an open 200 answer: (exit stack, chunk iterator, file position, unread bytes)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer) -> int:
        want = min(len(buffer), self.size - self._pos)
        if want <= 0:
            return 0
        data = self._fetch(self._pos, want)
        n = min(len(data), want)
        buffer[:n] = data[:n]
        self._pos += n
        return n

    def close(self) -> None:
        self._close_stream()
        super().close()

    def _close_stream(self) -> None:
        if self._stream is not None:
            self._stream[0].close()
            self._stream = None

    def _fetch(self, start: int, length: int) -> bytes:
        """One range, retried after a dropped connection, a timeout, 429 or 5xx (RANGE_RETRIES times,
        waiting RETRY_WAIT_S doubled each time, or the server's Retry-After when shorter than 30 s)."""
        # startup: only commands that reach the Hub load the HTTP stack
        import httpx2

        for attempt in range(RANGE_RETRIES + 1):
            wait = RETRY_WAIT_S * 2 ** attempt
            try:
                if self._stream is None or self._stream[2] > start:
                    data = self._request(start, length)
                    if data is not None:
                        return data
                if self._stream is not None:
                    return self._from_stream(start, length)
            except (httpx2.TransportError, httpx2.StreamError) as err:
                self._close_stream()
                if attempt == RANGE_RETRIES:
                    raise HubError(f"{self.name}: reading bytes {start}-{start + length - 1} failed "
                                   f"{RANGE_RETRIES + 1} times: {_first_line(err)}") from None
                log.info("%s: the connection failed on a range request; retrying in %.1f s", self.name, wait)
            except _Retry as retry:
                if attempt == RANGE_RETRIES:
                    retry.raise_status()
                wait = retry.after if retry.after is not None else wait
                log.info("%s: HTTP %d on a range request; retrying in %.1f s", self.name, retry.status, wait)
            time.sleep(wait)
        raise AssertionError("unreachable")

    def _request(self, start: int, length: int) -> bytes | None:
        """Ask for bytes [start, start + length): their bytes on a 206; None on a 200 (the server
        ignored the range), whose answer is kept open as the stream to read from."""

        # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
        from huggingface_hub.utils import get_session, hf_raise_for_status

        self._close_stream()
        headers = {**self._headers, "Range": f"bytes={start}-{start + length - 1}", "Accept-Encoding": "identity"}
        stack = ExitStack()
        try:
            response = stack.enter_context(get_session().stream("GET", self.url, headers=headers, timeout=60))
            self.requests += 1
            status = response.status_code
            if status == 429 or status >= 500:
                response.read()
                raise _Retry(response, hf_raise_for_status)
            if status >= 400:
                response.read()
                hf_raise_for_status(response)
            if status == 206:
                data = _read_at_most(response, length, self.name)
                self.bytes_fetched += len(data)
                return data
            if status != 200:
                raise HubError(f"{self.name}: the server answered a range request with HTTP {status}; download "
                               "the file and give its path")
            if not self.streamed:
                log.info("%s: the server ignored the byte range (HTTP 200); reading the file's start as a stream",
                         self.name)
            self.streamed = True
            self._stream = (stack, response.iter_bytes(STREAM_CHUNK), 0, b"")
            stack = None
            return None
        finally:
            if stack is not None:
                stack.close()

    def _from_stream(self, start: int, length: int) -> bytes:
        """Bytes [start, start + length) from the open whole-file answer, skipping any before `start`."""
        stack, chunks, pos, held = self._stream
        out = bytearray()
        while len(out) < length:
            if not held:
                held = next(chunks, b"")
                if not held:
                    self._stream = (stack, chunks, pos, b"")
                    raise HubError(f"{self.name}: the server's answer ended at byte {pos} of {self.size}")
                self.bytes_fetched += len(held)
            skip = max(0, start - pos)
            if skip >= len(held):
                pos, held = pos + len(held), b""
                continue
            take = held[skip:skip + length - len(out)]
            out += take
            pos += skip + len(take)
            held = held[skip + len(take):]
        self._stream = (stack, chunks, pos, held)
        return bytes(out)


# How much of a whole-file answer is taken from the socket at a time when a server ignores ranges.
STREAM_CHUNK = 16 * 1024


def _read_at_most(response, length: int, name: str) -> bytes:
    """A range answer's bytes, never more than the `length` asked for (a server may claim gigabytes)."""
    declared = response.headers.get("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > length:
        raise HubError(f"{name}: the server answered a range of {length} bytes with {declared} bytes; it is not "
                       "read: check HF_ENDPOINT")
    out = bytearray()
    for chunk in response.iter_bytes(STREAM_CHUNK):
        out += chunk
        if len(out) >= length:
            break
    return bytes(out[:length])


class _Retry(Exception):
    """A range request answered 429 or 5xx: to be tried again, or raised as the Hub's error."""

    def __init__(self, response, raise_for_status):
        self.status = response.status_code
        after = response.headers.get("Retry-After", "")
        self.after = float(after) if after.isdigit() and int(after) < 30 else None
        self._response, self._raise = response, raise_for_status

    def raise_status(self):
        self._raise(self._response)


@dataclass
class HubGGUF:
    """A target GGUF named on the Hub, opened: from the cache when it is there, else read in place."""

    gguf: object             # GGUFFile
    source: HubSource
    local_path: Path | None  # the cached file, when the whole file is local
    bytes_fetched: int = 0
    requests: int = 0


def _open_cached(ref: HubRef) -> HubGGUF | None:
    folder = hub_cache.snapshot(ref.repo, ref.revision or DEFAULT_REVISION)
    if folder is None:
        return None
    files = [p.relative_to(folder).as_posix() for p in folder.rglob("*.gguf")]
    try:
        name = pick_gguf(ref, files)
    except DflashError:
        return None
    return _cached_gguf(folder, name, HubSource(ref.repo, folder.name, name))


def _cached_gguf(folder: Path, name: str, source: HubSource) -> HubGGUF:
    """A GGUF of a cached snapshot, found through the confined reader (a link out of the cache is
    refused) and read where it really lies."""

    opened = find_in(folder, name, "cached GGUF")
    if opened is None:
        raise HubError(f"{folder / name}: vanished from the Hugging Face cache while it was read")
    try:
        return HubGGUF(GGUFFile(opened.real, name=name), source, folder / name)
    finally:
        opened.close()


def resolve_source(ref: HubRef) -> HubSource:
    """The commit `ref` names now (and for a GGUF, which file), from the Hub's model info alone."""
    info = model_info(ref)
    name = pick_gguf(ref, list(info.files)) if ref.is_gguf else None
    return HubSource(ref.repo, info.sha, name)


def fetch_gguf(ref: HubRef) -> Path:
    """The whole GGUF `ref` names, in the Hub cache (fetched when it is not there): what llama.cpp loads."""
    # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
    from huggingface_hub import hf_hub_download

    if not ref.is_gguf:
        raise HubError(f"{ref}: names a repository; name the GGUF as owner/name:QUANT or owner/name/file.gguf")
    if _offline():
        cached = _open_cached(ref)
        if cached is None:
            raise _offline_error(ref)
        cached.gguf.close()
        return cached.local_path
    source = resolve_source(ref)
    with hub_errors(ref), _quiet_progress():
        return Path(hf_hub_download(ref.repo, source.file, revision=source.revision))


def local_gguf(target: Path | HubRef) -> Path:
    """A --target a command runs: the local file, or the Hub's GGUF fetched into the Hub cache."""
    return fetch_gguf(target) if isinstance(target, HubRef) else target


def open_gguf(ref: HubRef) -> HubGGUF:
    """The GGUF `ref` names: from the cache if it is there, else its header and metadata only, read by
    range requests. Its provenance is the exact commit read."""
    # after: hub/transport.py has checked the Hub settings (huggingface_hub reads them when imported)
    from huggingface_hub import get_hf_file_metadata, hf_hub_url, try_to_load_from_cache

    if _offline():
        cached = _open_cached(ref)
        if cached is None:
            raise _offline_error(ref)
        return cached
    resolved = resolve_source(ref)
    sha, name = resolved.revision, resolved.file
    with hub_errors(ref):
        hub_cache.check_repo(ref.repo, sha)
        cached = try_to_load_from_cache(ref.repo, name, revision=sha)
        if isinstance(cached, str):
            log.info("%s: %s is in the cache", ref, name)
            return _cached_gguf(Path(cached[:-len(name)]), name, HubSource(ref.repo, sha, name))
        url = hf_hub_url(ref.repo, name, revision=sha)
        meta = get_hf_file_metadata(url)
        etag = (meta.etag or "").strip('"')
        source = HubSource(ref.repo, sha, name, etag if _SHA256.fullmatch(etag) else None)
        if not meta.size:
            raise HubError(f"{ref}: the Hub gave no size for {name}; download it and give its path")
        # Read from where the Hub redirects (the CDN for LFS files), sparing a redirect per read.
        same_origin = urlsplit(meta.location).netloc == urlsplit(url).netloc
        remote = HubRangeFile(meta.location, meta.size, f"{ref.repo}/{name}", token=same_origin)
        try:
            gguf = GGUFFile(remote, name=f"{ref.repo}/{name}")
        finally:
            remote.close()  # the header and metadata are all it is read for; a stream is hung up here
    log.info("%s: read %d bytes of metadata from %s (%d bytes) with %d %s, %d bytes fetched",
             ref, gguf.data_offset, name, meta.size, remote.requests,
             "requests (the server ignored byte ranges)" if remote.streamed else "range requests",
             remote.bytes_fetched)
    return HubGGUF(gguf, source, None, remote.bytes_fetched, remote.requests)
