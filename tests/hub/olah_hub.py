"""A real Hugging Face mirror on 127.0.0.1: PyPI `olah` (pinned in the `test-mirror` extra) serving
local git repositories offline, beside the stand-in of tests/local_hub.py.

olah differs from the Hub where a mirror user meets it (docs/convert.md#hub-ids-mirrors-and-offline-caches):
`/api/models/O/N` without a revision answers 401 for its local repos while
`/api/models/O/N/revision/main` answers 200;
`resolve` ignores `Range` (200, chunked, the whole body); an unknown revision answers 401
RepoNotFound (the Hub: 404 RevisionNotFound); it has no upload API.

    mirror = OlahMirror(tmp)                     # an empty mirrors folder
    mirror.add_folder("org/name", folder)        # one git commit of a folder's files (branch main)
    mirror.tag("org/name", "v1")
    with mirror.running():                       # olah in a child process, reaped on the way out
        env = mirror.env(hf_home)
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

START_TIMEOUT_S = 60


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@localhost", "GIT_CONFIG_GLOBAL": os.devnull}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OlahMirror:
    def __init__(self, root: Path):
        self.root = root
        self.mirrors = root / "mirrors"
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / "olah.log"

    # -- content --------------------------------------------------------------------------------
    def _repo(self, repo_id: str) -> Path:
        return self.mirrors / "models" / repo_id

    def add_folder(self, repo_id: str, folder: Path, files: dict[str, str | bytes] | None = None) -> str:
        """Commit `folder`'s files (and `files`, path -> content) as the repository's next commit on
        main; the commit sha."""
        repo = self._repo(repo_id)
        if not (repo / ".git").is_dir():
            repo.mkdir(parents=True)
            _git(repo, "init", "-q", "-b", "main")
        for p in repo.iterdir():
            if p.name != ".git":
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        shutil.copytree(folder, repo, dirs_exist_ok=True)
        for path, content in (files or {}).items():
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            (repo / path).write_bytes(content.encode() if isinstance(content, str) else content)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"commit {repo_id}")
        return _git(repo, "rev-parse", "HEAD")

    def tag(self, repo_id: str, name: str, sha: str = "HEAD") -> None:
        _git(self._repo(repo_id), "tag", name, sha)

    # -- the server -----------------------------------------------------------------------------
    def _config(self) -> Path:
        config = self.root / "olah.toml"
        config.write_text(
            "[basic]\n"
            f'host = "127.0.0.1"\nport = {self.port}\n'
            f'repos-path = "{self.root / "cache"}"\nmirrors-path = ["{self.mirrors}"]\n'
            "metadata-cache-ttl = 0\n"
            "[accessibility]\noffline = true\n")
        return config

    @contextmanager
    def running(self):
        """olah in a child process of its own group, up before the body runs; ended and reaped after."""
        config = self._config()
        with open(self.log, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-c", "from olah.server import cli; cli()", "-c", str(config),
                                     "--log-path", str(self.root / "logs")], cwd=self.root, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait_up(proc)
            yield self
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()

    def _wait_up(self, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"olah exited with {proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(self.url + "/api/whoami-v2", timeout=2)
                return
            except urllib.error.HTTPError:
                return  # it answers
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"olah did not answer within {START_TIMEOUT_S} s: {self.log.read_text()[-2000:]}")

    def env(self, hf_home: Path, **extra: str) -> dict[str, str]:
        """The environment of a command that reads through the mirror: HF_ENDPOINT, HF_HOME, no proxy."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(HF_ENDPOINT=self.url, HF_HOME=str(hf_home), HF_HUB_DISABLE_TELEMETRY="1",
                   NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost", **extra)
        return env
