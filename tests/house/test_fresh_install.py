"""A fresh machine: the pinned sdist fetched as a plain file from a package index, and the package
installed from its wheel into a new venv, with an empty cache and no PyTorch."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from dflash_gguf.hashing import sha256_file
from dflash_gguf.runner import sdist
from tests.conftest import REPO, dflash_gguf

def _pinned_archive() -> Path:
    return sdist.sdist_path()  # verified; downloaded by the first test that needs it


class _Index(http.server.ThreadingHTTPServer):
    """A PEP 691 simple index on 127.0.0.1 listing one archive (any bytes) under the sdist's name."""

    def __init__(self, payload: Path):
        self.payload = payload
        self.requests: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(handler):
                self.requests.append(handler.path)
                if handler.path == f"/simple/{sdist.PACKAGE}/":
                    body = json.dumps({"meta": {"api-version": "1.1"}, "name": sdist.PACKAGE, "files": [
                        {"filename": sdist.SDIST_NAME, "url": f"/files/{sdist.SDIST_NAME}", "hashes": {}}]}).encode()
                    ctype = "application/vnd.pypi.simple.v1+json"
                elif handler.path == f"/files/{sdist.SDIST_NAME}":
                    body, ctype = self.payload.read_bytes(), "application/octet-stream"
                else:
                    handler.send_error(404)
                    return
                handler.send_response(200)
                handler.send_header("Content-Type", ctype)
                handler.send_header("Content-Length", str(len(body)))
                handler.end_headers()
                handler.wfile.write(body)

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/simple"

    def __enter__(self):
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()


def _index_env(tmp_path: Path, index_url: str) -> dict[str, str]:
    cache = tmp_path / "cache"
    return {**os.environ, "DFLASH_GGUF_CACHE": str(cache), "PIP_INDEX_URL": index_url,
            "PIP_EXTRA_INDEX_URL": " "}


def test_sdist_is_fetched_from_the_index_without_a_build_backend(tmp_path):
    archive = _pinned_archive()
    with _Index(archive) as index:
        env = _index_env(tmp_path, index.url)
        proc = subprocess.run([sys.executable, "-m", "dflash_gguf.runner.sdist"], env=env,
                              capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    fetched = Path(proc.stdout.strip())
    assert fetched == tmp_path / "cache" / "sdist" / sdist.SDIST_NAME
    assert sha256_file(fetched) == sdist.SDIST_SHA256
    assert index.requests == [f"/simple/{sdist.PACKAGE}/", f"/files/{sdist.SDIST_NAME}"]


def test_a_tampered_sdist_is_refused_and_nothing_is_kept(tmp_path):
    fake = tmp_path / "fake.tar.gz"
    fake.write_bytes(b"not the pinned archive")
    with _Index(fake) as index:
        proc = dflash_gguf("llama", "build", "--prepare-only", env=_index_env(tmp_path, index.url))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "does not match the pinned" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert [p.name for p in (tmp_path / "cache" / "sdist").iterdir()] == []


def test_an_index_without_the_sdist_says_so(tmp_path):
    (tmp_path / "empty-index").mkdir()
    proc = dflash_gguf("llama", "build", "--prepare-only",
                       env=_index_env(tmp_path, (tmp_path / "empty-index").as_uri()))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {sdist.SDIST_NAME} is not on ") and proc.stderr.count("\n") == 1


# ---------------------------------------------------------------------------------------------
# The wheel in a new venv
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    """A new venv with only the built wheel and its base dependencies installed."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", "*.gguf"))
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(work / "dist"), str(src)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = (work / "dist").glob("dflash_gguf-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "dflash_gguf/ggml_patches/series" in names
    assert any(n.startswith("dflash_gguf/ggml_patches/0001-") for n in names)
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return venv


def _installed(venv: Path, *args, env=None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "dflash-gguf"), *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=600)


def test_wheel_has_no_pytorch_and_runs(wheel_venv, tmp_path):
    from dflash_gguf import __version__

    proc = _installed(wheel_venv, "--version", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip().endswith(__version__)
    probe = subprocess.run([str(wheel_venv / "bin" / "python"), "-c",
                            "import importlib.util as u; print([m for m in ('torch','transformers','dflash') if u.find_spec(m)])"],
                           capture_output=True, text=True, cwd=tmp_path)
    assert probe.stdout.strip() == "[]"


def test_wheel_converts_like_the_checkout(wheel_venv, fixtures, target_gguf, converted, tmp_path):
    out = tmp_path / "dflash.gguf"
    proc = _installed(wheel_venv, "convert", fixtures / "dflash-b16", "--target", target_gguf, "-o", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == converted["dflash-b16"].read_bytes()


def test_wheel_prepares_a_patched_tree_in_an_empty_cache(wheel_venv, tmp_path):
    # a file:// index holding the verified archive: the real download path, without the network
    index = tmp_path / "index"
    (index / sdist.PACKAGE).mkdir(parents=True)
    os.link(_pinned_archive(), index / sdist.PACKAGE / sdist.SDIST_NAME)
    env = _index_env(tmp_path, index.as_uri())
    proc = _installed(wheel_venv, "llama", "build", "--prepare-only", "--backend", "cpu", env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    src = Path(proc.stdout.strip())
    assert src.is_relative_to(tmp_path / "cache")
    # every patch of the shipped series is in the tree (but for the lines a later patch of the series rewrites)
    from dflash_gguf.runner.build import patched_paths, read_series
    series = read_series()
    for n, patch in enumerate(series):
        rewritten = {line[1:] for later in series[n + 1:] for line in later.read_text().splitlines()
                     if line.startswith("-") and not line.startswith("---")}
        added = [line[1:] for line in patch.read_text().splitlines()
                 if line.startswith("+") and not line.startswith("+++") and len(line.strip()) > 20]
        touched = "".join((src / p).read_text(errors="replace") for p in patched_paths(patch))
        assert added and all(line in touched for line in added if line not in rewritten), patch.name


def test_wheel_names_the_extra_a_command_needs(wheel_venv, fixtures, target_gguf, converted, tmp_path):
    proc = _installed(wheel_venv, "validate", "--target", target_gguf, "--draft", converted["dflash-b16"],
                      "--reference-draft", fixtures / "dflash-b16", "--reference-target", fixtures / "target-hf",
                      cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "pip install 'dflash-gguf[reference]'" in proc.stderr, proc.stderr


@pytest.mark.integration
def test_wheel_loads_the_patched_library_through_the_sdist_bindings(wheel_venv, llama_bin, target_gguf, tmp_path):
    code = ("from dflash_gguf.runner.bindings import load_model; import sys; "
            "m = load_model(sys.argv[1], backend='cpu', n_ctx=64); print(m.n_vocab(), m.tokenize(b'Hello world!', add_bos=False))")
    proc = subprocess.run([str(wheel_venv / "bin" / "python"), "-c", code, str(target_gguf)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split(" ", 1) == ["151936", "[9707, 1879, 0]\n"]
