"""A local stand-in for the Hugging Face Hub on 127.0.0.1, for the tests that talk to "the Hub".

It answers the calls huggingface_hub makes (checked against the installed version, 2.4):

    read    GET  /api/models/O/N[/revision/REV]       model info: id, sha, siblings, gated
            GET  /api/models/O/N/tree/REV[/PATH]      the file listing (?recursive=true)
            GET  /api/models/O/N/refs                 branches and their commits (llama.cpp's `-hf`)
            POST /api/models/O/N/paths-info/REV       listing of given paths
            HEAD/GET /O/N/resolve/REV/PATH            a file: X-Repo-Commit, ETag, sizes; Range -> 206.
                                                      LFS files (weights, GGUF) redirect, as on the Hub,
                                                      with X-Linked-Size / X-Linked-Etag, to a second
                                                      server standing for the CDN (another origin, so
                                                      huggingface_hub reads the metadata off the redirect)
    write   POST /api/repos/create, /api/validate-yaml, /api/models/O/N/preupload/REV,
                 /api/models/O/N/commit/REV           (files sent inline, base64; deleted files)
                 with `lfs_uploads`, LFS files as the Hub takes them: POST /O/N.git/info/lfs/objects/batch
                 says where to PUT each one and where to verify it, both on the CDN (another origin)

and the errors the Hub gives, with its X-Error-Code header (and, on demand, failing range requests:
`fail_ranges`): 404 RepoNotFound / RevisionNotFound /
EntryNotFound, and for a gated repository 401 (no token) or 403 (a token without access) GatedRepo
on file downloads (its model info stays public). A file may be "virtual": its first bytes given,
the rest zeros up to a declared size, so a multi-GB GGUF can be served without existing on disk.
Every request is recorded in `calls`, with the body bytes sent back.

A hostile server (issue 35): `answer(PATH_REGEX, fn)` makes `fn(handler)` answer the requests whose
path fullmatches PATH_REGEX, on the Hub or on the CDN (the second origin, "another host"): the
helpers below answer raw bytes and headers, never answer, or drip headers or a body.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".gguf", ".pt", ".bin")


@dataclass
class Blob:
    """A file's content: `data`, then zeros up to `size` (a virtual file when size > len(data))."""

    data: bytes
    size: int = -1
    sha256: str | None = None  # what the Hub declares; computed from the data unless given

    def __post_init__(self) -> None:
        if self.size < 0:
            self.size = len(self.data)
        if self.sha256 is None:
            if self.size != len(self.data):
                raise ValueError("a virtual blob needs its declared sha256")
            self.sha256 = hashlib.sha256(self.data).hexdigest()

    @property
    def git_oid(self) -> str:
        return hashlib.sha1(b"blob %d\0" % self.size + self.data).hexdigest()

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end)."""
        head = self.data[start:end]
        return head + b"\0" * (end - start - len(head))


@dataclass
class HubRepo:
    commits: dict[str, dict[str, Blob]] = field(default_factory=dict)  # sha -> path -> blob
    refs: dict[str, str] = field(default_factory=dict)                 # branch / tag -> sha
    gated: bool = False
    allowed_tokens: set[str] = field(default_factory=set)


def _as_blob(value: bytes | str | Path | Blob) -> Blob:
    if isinstance(value, Blob):
        return value
    if isinstance(value, Path):
        return Blob(value.read_bytes())
    return Blob(value.encode() if isinstance(value, str) else bytes(value))


def is_lfs(path: str) -> bool:
    return path.endswith(LFS_SUFFIXES)


class LocalHub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hub = self
        self.cdn = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.cdn.daemon_threads = True
        self.cdn.hub = self
        self.store: dict[str, HubRepo] = {}
        self.calls: list[dict] = []
        self.commits: dict[str, list[list[dict]]] = {}  # repo -> commit payloads received, in order
        self.fail_commit: tuple[int, dict] | None = None
        self.ignored: set[str] = set()  # paths the pre-upload answers `shouldIgnore` for (a .gitignore rule)
        self.ignore_ranges = False  # answer range requests with the whole file, as some servers do
        # a careless server: every error echoes the request's Authorization header, in its message
        # and as its request id (what the secret filter must keep out of every output)
        self.echo_authorization = False
        self.fail_all: int | None = None  # every GET and HEAD answers this HTTP status (an error)
        # what the next range requests get instead of their bytes: an HTTP status, or "drop" (the
        # connection closed without an answer), one per request, in order
        self.fail_ranges: list[int | str] = []
        self.lfs_uploads = False  # preupload answers "lfs" for LFS files: they go up through the CDN
        self.uploaded: dict[str, bytes] = {}  # sha256 -> bytes PUT to the CDN
        self.hostile: list[tuple[re.Pattern, object]] = []
        self.closing = threading.Event()  # set by stop(): hanging answers end
        self._lock = threading.Lock()
        self._serial = 0

    def answer(self, path: str, fn) -> None:
        """`fn(handler)` answers every request whose path fullmatches `path` (a regex), first match wins."""
        self.hostile.append((re.compile(path), fn))

    scheme = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.cdn.server_address[1]}"

    @property
    def repos(self) -> set[str]:
        return set(self.store)

    # -- content ------------------------------------------------------------------------------------
    def add_commit(self, repo_id: str, files: dict[str, bytes | str | Path | Blob], *, branch: str = "main",
                   replace: bool = True, gated: bool | None = None, allowed_tokens: tuple[str, ...] = (),
                   deleted: list[str] | tuple[str, ...] = ()) -> str:
        """Commit `files` to `branch` (creating the repo) and return the commit sha. `replace=False`
        keeps the branch's other files, as a Hub commit that adds files does, less `deleted`."""
        with self._lock:
            repo = self.store.setdefault(repo_id, HubRepo())
            if gated is not None:
                repo.gated = gated
            repo.allowed_tokens.update(allowed_tokens)
            self._serial += 1
            sha = hashlib.sha1(f"{repo_id}\0{self._serial}".encode()).hexdigest()
            base = {} if replace or branch not in repo.refs else dict(repo.commits[repo.refs[branch]])
            base.update({path: _as_blob(v) for path, v in files.items()})
            for path in deleted:
                base.pop(path, None)
            repo.commits[sha] = base
            repo.refs[branch] = sha
            return sha

    def tag(self, repo_id: str, name: str, sha: str) -> None:
        self.store[repo_id].refs[name] = sha

    def add_folder(self, repo_id: str, folder: Path, **kwargs) -> str:
        files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}
        return self.add_commit(repo_id, files, **kwargs)

    def resolve(self, repo_id: str, revision: str) -> tuple[HubRepo, str] | None:
        repo = self.store.get(repo_id)
        if repo is None:
            return None
        sha = repo.refs.get(revision) or (revision if revision in repo.commits else None)
        return (repo, sha) if sha else (repo, "")

    def bytes_sent(self, path_suffix: str) -> int:
        """Body bytes sent for requests whose path ends with `path_suffix`."""
        return sum(c["sent"] for c in self.calls if c["path"].endswith(path_suffix))

    def blob_by_sha256(self, sha256: str) -> Blob | None:
        for repo in self.store.values():
            for files in repo.commits.values():
                for blob in files.values():
                    if blob.sha256 == sha256:
                        return blob
        return None


def _entry(path: str, blob: Blob) -> dict:
    entry = {"type": "file", "path": path, "size": blob.size, "oid": blob.git_oid}
    if is_lfs(path):
        entry["lfs"] = {"oid": blob.sha256, "size": blob.size, "pointerSize": 134}
    return entry


def _folders(paths) -> list[str]:
    out = set()
    for p in paths:
        parts = p.split("/")[:-1]
        out.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return sorted(out)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ThreadingHTTPServer  # the Hub, or its CDN; `.hub` is the LocalHub either way

    @property
    def hub(self) -> LocalHub:
        return self.server.hub

    def log_message(self, *args) -> None:
        pass

    # -- plumbing -----------------------------------------------------------------------------------
    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _record(self, body: bytes) -> dict:
        split = urlsplit(self.path)
        call = {"method": self.command, "path": unquote(split.path), "query": parse_qs(split.query),
                "body": body, "headers": {k.lower(): v for k, v in self.headers.items()}, "sent": 0}
        call["cdn"] = self.server is not self.hub
        self.hub.calls.append(call)
        return call

    def _reply(self, status: int, body: bytes = b"", headers: dict | None = None,
               content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
            self._call["sent"] += len(body)

    def _json(self, status: int, payload, headers: dict | None = None) -> None:
        self._reply(status, json.dumps(payload).encode(), headers)

    def _error(self, status: int, code: str | None, message: str) -> None:
        if self.hub.echo_authorization:
            auth = self.headers.get("Authorization", "")
            message = f"{message} (request was sent with Authorization: {auth})"
            headers = {"X-Request-Id": f"req-{auth}", "X-Error-Message": message}
            if code:
                headers["X-Error-Code"] = code
            return self._json(status, {"error": message}, headers)
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._json(status, {"error": message}, headers)

    def _repo_at(self, repo_id: str, revision: str) -> tuple[HubRepo, str] | None:
        found = self.hub.resolve(repo_id, revision)
        if found is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        if not found[1]:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return found

    # -- verbs --------------------------------------------------------------------------------------
    def _hostile(self) -> bool:
        for pattern, fn in self.hub.hostile:
            if pattern.fullmatch(self._call["path"]):
                fn(self)
                return True
        return False

    def do_HEAD(self) -> None:
        self._call = self._record(b"")
        self._hostile() or self._route_get()

    def do_GET(self) -> None:
        self._call = self._record(b"")
        self._hostile() or self._route_get()

    def do_POST(self) -> None:
        body = self._body()
        self._call = self._record(body)
        self._hostile() or self._route_post(self._call["path"], body)

    def do_PUT(self) -> None:
        body = self._body()
        self._call = self._record(body)
        parts = self._call["path"].strip("/").split("/")
        if self._hostile():
            return
        if parts[0] == "_upload" and len(parts) == 2 and hashlib.sha256(body).hexdigest() == parts[1]:
            self.hub.uploaded[parts[1]] = body
            return self._reply(200)
        self._error(400, None, "bad upload")

    def _route_get(self) -> None:
        if self.hub.fail_all:
            return self._error(self.hub.fail_all, None, "the server failed this request")
        path = self._call["path"]
        parts = path.strip("/").split("/")
        if parts[0] == "_lfs" and len(parts) == 2:
            blob = self.hub.blob_by_sha256(parts[1])
            return self._file(blob, {}) if blob else self._error(404, None, "no such object")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo_id = "/".join(parts[2:4])
            if len(parts) == 4:
                return self._info(repo_id, "main")
            if parts[4] == "revision" and len(parts) >= 6:
                return self._info(repo_id, "/".join(parts[5:]))
            if parts[4] == "tree" and len(parts) >= 6:
                return self._tree(repo_id, parts[5], "/".join(parts[6:]))
            if parts[4] == "refs" and len(parts) == 5:
                return self._refs(repo_id)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]))
        self._error(404, None, f"no route {path}")

    def _info(self, repo_id: str, revision: str) -> None:
        found = self._repo_at(repo_id, revision)
        if found:
            repo, sha = found
            self._json(200, {"id": repo_id, "modelId": repo_id, "sha": sha, "private": False,
                             "gated": "manual" if repo.gated else False,
                             "siblings": [{"rfilename": p} for p in sorted(repo.commits[sha])]})

    def _refs(self, repo_id: str) -> None:
        repo = self.hub.store.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found")
        branches = [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": sha}
                    for n, sha in sorted(repo.refs.items())]
        self._json(200, {"branches": branches, "tags": [], "converts": []})

    def _tree(self, repo_id: str, revision: str, under: str) -> None:
        found = self._repo_at(repo_id, revision)
        if not found:
            return
        repo, sha = found
        files = repo.commits[sha]
        recursive = self._call["query"].get("recursive", ["false"])[0].lower() == "true"
        prefix = f"{under}/" if under else ""

        def shown(p: str) -> bool:
            return p.startswith(prefix) and (recursive or "/" not in p[len(prefix):])

        entries = [{"type": "directory", "path": d, "oid": hashlib.sha1(d.encode()).hexdigest()}
                   for d in _folders(files) if shown(d)]
        entries += [_entry(p, b) for p, b in sorted(files.items()) if shown(p)]
        self._json(200, entries)

    def _authorized(self, repo: HubRepo) -> bool:
        if not repo.gated:
            return True
        auth = self.headers.get("Authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        if token is None:
            self._error(401, "GatedRepo", "Access to this model is restricted. You must have access to it "
                                          "and be authenticated to access it. Please log in.")
            return False
        if token not in repo.allowed_tokens:
            self._error(403, "GatedRepo", "Access to this model is restricted and you are not in the "
                                          "authorized list.")
            return False
        return True

    def _resolve(self, repo_id: str, revision: str, path: str) -> None:
        found = self._repo_at(repo_id, unquote(revision))
        if not found:
            return
        repo, sha = found
        if not self._authorized(repo):
            return
        blob = repo.commits[sha].get(path)
        if blob is None:
            return self._error(404, "EntryNotFound", f"{path} does not exist on {revision}")
        headers = {"X-Repo-Commit": sha}
        if is_lfs(path):
            headers.update({"Location": f"{self.hub.cdn_url}/_lfs/{blob.sha256}", "X-Linked-Size": blob.size,
                            "X-Linked-Etag": f'"{blob.sha256}"', "ETag": f'"{blob.git_oid}"'})
            return self._reply(302, b"", headers)
        headers["ETag"] = f'"{blob.git_oid}"'
        self._file(blob, headers)

    def _file(self, blob: Blob, headers: dict) -> None:
        headers = {**headers, "Accept-Ranges": "bytes"}
        wanted = None if self.hub.ignore_ranges else self.headers.get("Range")
        if wanted and self.hub.fail_ranges:
            failure = self.hub.fail_ranges.pop(0)
            if failure == "drop":
                self.close_connection = True
                self.connection.shutdown(2)
                return
            return self._error(int(failure), None, "try again later")
        start, end, status = 0, blob.size, 200
        if wanted:
            first, _, last = wanted.removeprefix("bytes=").partition("-")
            start = int(first)
            end = min(int(last) + 1 if last else blob.size, blob.size)
            if start >= blob.size:
                return self._reply(416, b"", {"Content-Range": f"bytes */{blob.size}"})
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{blob.size}"
            status = 206
        self.send_response(status)
        for k, v in {**headers, "Content-Type": "application/octet-stream", "Content-Length": end - start}.items():
            self.send_header(k, str(v))
        self.end_headers()
        if self.command == "HEAD":
            return
        try:  # in chunks: a virtual file may be gigabytes, and the client may hang up
            for pos in range(start, end, 1 << 20):
                chunk = blob.read(pos, min(pos + (1 << 20), end))
                self.wfile.write(chunk)
                self._call["sent"] += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _route_post(self, path: str, body: bytes) -> None:
        hub = self.hub
        if path == "/api/repos/create":
            req = json.loads(body)
            repo = f"{req['organization']}/{req['name']}"
            if repo in hub.store:
                return self._json(409, {"url": f"{hub.url}/{repo}", "error": "You already created this model repo"})
            hub.store[repo] = HubRepo()
            return self._json(200, {"url": f"{hub.url}/{repo}"})
        if path == "/api/validate-yaml":
            return self._json(200, {"errors": [], "warnings": []})
        if path.endswith(".git/info/lfs/objects/batch"):
            return self._lfs_batch(json.loads(body))
        if path == "/_verify":
            oid = json.loads(body)["oid"]
            return self._json(200 if oid in hub.uploaded else 404, {})
        parts = path.strip("/").split("/")  # api/models/ORG/NAME/(preupload|commit|paths-info)/REV
        if len(parts) >= 6 and parts[:2] == ["api", "models"]:
            repo_id, action, revision = "/".join(parts[2:4]), parts[4], unquote("/".join(parts[5:]))
            if repo_id not in hub.store:
                return self._error(404, "RepoNotFound", "Repository not found")
            if action == "paths-info":
                return self._paths_info(repo_id, revision, body)
            if action == "preupload":
                files = json.loads(body)["files"]
                mode = {True: "lfs", False: "regular"}
                return self._json(200, {"files": [{"path": f["path"], "shouldIgnore": f["path"] in hub.ignored,
                                                   "uploadMode": mode[hub.lfs_uploads and is_lfs(f["path"])]}
                                                  for f in files]})
            if action == "commit":
                return self._commit(repo_id, revision, body)
        self._error(404, None, f"no route {path}")

    def _lfs_batch(self, request: dict) -> None:
        cdn = self.hub.cdn_url
        objects = [{"oid": o["oid"], "size": o["size"], "actions": {
            "upload": {"href": f"{cdn}/_upload/{o['oid']}"}, "verify": {"href": f"{cdn}/_verify"}}}
            for o in request["objects"]]
        self._json(200, {"transfer": "basic", "objects": objects})

    def _paths_info(self, repo_id: str, revision: str, body: bytes) -> None:
        found = self._repo_at(repo_id, revision)
        if not found:
            return
        repo, sha = found
        form = parse_qs(body.decode())
        wanted = form.get("paths", [])
        files = repo.commits[sha]
        self._json(200, [_entry(p, files[p]) for p in wanted if p in files])

    def _commit(self, repo_id: str, revision: str, body: bytes) -> None:
        hub = self.hub
        if hub.fail_commit:
            return self._json(*hub.fail_commit)
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        hub.commits.setdefault(repo_id, []).append(lines)
        files = {ln["value"]["path"]: base64.b64decode(ln["value"]["content"]) for ln in lines if ln["key"] == "file"}
        files.update({ln["value"]["path"]: hub.uploaded[ln["value"]["oid"]] for ln in lines if ln["key"] == "lfsFile"})
        deleted = [ln["value"]["path"] for ln in lines if ln["key"] == "deletedFile"]
        sha = hub.add_commit(repo_id, files, branch=revision, replace=False, deleted=deleted)
        oid = f"{len(hub.commits[repo_id]):040x}"
        self._json(200, {"commitUrl": f"{hub.url}/{repo_id}/commit/{oid}", "commitOid": oid, "success": True,
                         "sha": sha})


# -- hostile answers (LocalHub.answer) ------------------------------------------------------------------

def raw(status: int, body: bytes = b"", headers: dict | None = None, content_type: str = "application/json"):
    """An answer of exactly these bytes and headers."""
    def fn(handler: _Handler) -> None:
        handler._reply(status, body, headers, content_type)
    return fn


def hang(handler: _Handler) -> None:
    """Read the request, never answer (until the Hub stops)."""
    handler.close_connection = True
    handler.hub.closing.wait()


def drip(headers_too: bool, every_s: float = 0.2):
    """Answer one byte every `every_s` seconds: of the header lines (`headers_too`), else of a body
    announced as 1 GB (a HEAD is answered as the Hub does); until the client hangs up or the Hub stops."""
    def fn(handler: _Handler) -> None:
        if handler.command == "HEAD" and not headers_too:
            return handler._route_get()  # the file's metadata as the Hub gives it; its body drips
        handler.close_connection = True
        head = b"HTTP/1.1 200 OK\r\n"
        if not headers_too:
            head += b"Content-Type: application/octet-stream\r\nContent-Length: 1000000000\r\n\r\n"
        try:
            handler.wfile.write(head)
            handler.wfile.flush()
            while not handler.hub.closing.wait(every_s):
                handler.wfile.write(b"X" if headers_too else b"\0")
                handler.wfile.flush()
        except OSError:
            pass
    return fn


def model_info(hub: LocalHub, repo_id: str, **changes) -> bytes:
    """`repo_id`'s model info at main as the Hub gives it, with `changes` (a value None: the key left out)."""
    repo = hub.store[repo_id]
    sha = repo.refs["main"]
    info = {"id": repo_id, "modelId": repo_id, "sha": sha, "private": False, "gated": False,
            "siblings": [{"rfilename": p} for p in sorted(repo.commits[sha])]}
    info.update(changes)
    return json.dumps({k: v for k, v in info.items() if v is not None}).encode()


def start(tls: tuple[Path, Path] | None = None) -> LocalHub:
    """Start the Hub and its CDN; `tls` = (certificate, key) serves both over HTTPS."""
    server = LocalHub()
    if tls is not None:
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*map(str, tls))
        for s in (server, server.cdn):
            s.socket = context.wrap_socket(s.socket, server_side=True)
        server.scheme = "https"
    for s in (server, server.cdn):  # shutdown() waits up to one poll interval (0.5 s by default)
        threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    return server


def stop(server: LocalHub) -> None:
    server.closing.set()
    for s in (server, server.cdn):
        s.shutdown()
        s.server_close()


def hub_env(hub: LocalHub, tmp_path: Path, token: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a command that talks to `hub`: HF_ENDPOINT, an empty HF_HOME, no proxy."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1",
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    env.update(extra)
    if token:
        env["HF_TOKEN"] = token
    return env
