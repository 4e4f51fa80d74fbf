"""`release --into REPO` (release/sidecar.py): the drafter beside the target's quants, found by
llama.cpp's `-hf` by itself.

The end-to-end test commits the trained drafter into a target GGUF repository on the local Hub
stand-in, then starts the patched llama-server with `-hf REPO:QUANT --spec-type draft-dflash` and
no `-md`, its MODEL_ENDPOINT at the local Hub: the server downloads the model and our sidecar and
drafts with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from dflash_gguf.licenses import split_front_matter
from dflash_gguf.release.sidecar import default_target, model_files, placement_folder
from dflash_gguf.runner.build import runtime_env
from tests.conftest import dflash_gguf
from tests.refusal import assert_refused
from tests.local_hub import hub_env

TOKEN = "hf_LocalHubToken0123456789"
REPO = "org/Trained-GGUF"
TARGET_CARD = "---\nlicense: apache-2.0\n---\n# The target's own card\n"


# -- where the files go ------------------------------------------------------------------------------

def test_model_files_leave_out_sidecars():
    files = ["README.md", "M-Q4_K_M.gguf", "mmproj-M-F16.gguf", "dflash-M-Q8_0.gguf", "dspark-M-Q8_0.gguf",
             "M.imatrix.gguf", "mtp-M.gguf", "eagle3-M.gguf", "sub/M-Q8_0.gguf"]
    assert model_files(files) == ["M-Q4_K_M.gguf", "sub/M-Q8_0.gguf"]


@pytest.mark.parametrize("models, folder", [
    (["M-Q4_K_M.gguf", "M-Q8_0.gguf"], ""),
    (["Q4_K_M/M-Q4_K_M-00001-of-00002.gguf", "Q4_K_M/M-Q4_K_M-00002-of-00002.gguf"], "Q4_K_M"),
    (["Q4_K_M/M-Q4_K_M.gguf", "Q8_0/M-Q8_0.gguf"], ""),
    (["gguf/a/M-Q4_K_M.gguf", "gguf/b/M-Q8_0.gguf"], "gguf"),
    (["gguf/M-Q4_K_M.gguf", "gguf/M-Q8_0.gguf"], "gguf"),
])
def test_the_folder_is_the_deepest_one_above_every_model_file(models, folder):
    assert placement_folder(models) == folder


def test_the_default_target_is_what_hf_runs_without_a_quant():
    assert default_target("o/r", None, ["M-Q8_0.gguf", "M-Q4_K_M.gguf"]).path == "M-Q4_K_M.gguf"
    assert default_target("o/r", None, ["M-F16.gguf", "M-Q8_0.gguf"]).path == "M-Q8_0.gguf"
    assert default_target("o/r", None, ["dflash-M-Q4_K_M.gguf", "M-F16.gguf"]).path == "M-F16.gguf"
    first = ["M-BF16-00002-of-00002.gguf", "M-BF16-00001-of-00002.gguf"]
    assert default_target("o/r", "v1", first).path == "M-BF16-00001-of-00002.gguf"


# -- end to end ---------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _into(env, *extra):
    return dflash_gguf("release", Path("tests/fixtures/trained/dflash").resolve(), "--into", REPO,
                       "--types", "F16,Q8_0", "--license", "mit", "--skip-validate", *extra, env=env)


def _run_hf(llama_bin: Path, hub, tmp_path: Path, tag: str, **extra_env: str) -> tuple[dict, str]:
    """llama-server -hf REPO:tag --spec-type draft-dflash (no -md): one greedy completion and the log."""
    port = _free_port()
    env = runtime_env(llama_bin, {**os.environ, "MODEL_ENDPOINT": hub.url + "/", "LLAMA_CACHE": str(tmp_path / "cache"),
                                  "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1", **extra_env})
    env.pop("HF_TOKEN", None)
    log = tmp_path / f"server-{tag}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(llama_bin / "llama-server"), "-hf", f"{REPO}:{tag}", "--spec-type", "draft-dflash",
                                 "--spec-draft-n-max", "15", "--host", "127.0.0.1", "--port", str(port),
                                 "-t", "1", "-c", "512", "-np", "1"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.3)
        assert proc.poll() is None, log.read_text()[-2000:]
        body = json.dumps({"prompt": "The quick brown fox", "n_predict": 48, "temperature": 0}).encode()
        reply = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body),
                                       timeout=120)
        return json.loads(reply.read()), log.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.integration
def test_hf_finds_and_drafts_with_the_sidecar(hub, trained_pair, llama_bin, tmp_path):
    hub.add_commit(REPO, {"Trained-F16.gguf": trained_pair["target"], "README.md": TARGET_CARD})
    env = hub_env(hub, tmp_path, token=TOKEN)

    proc = _into(env, "--json")
    assert proc.returncode == 0, proc.stderr
    placed = json.loads(proc.stdout)
    assert placed["skipped"] is False and placed["folder"] == ""
    files = hub.store[REPO].commits[hub.store[REPO].refs["main"]]
    assert sorted(files) == ["README.md", "Trained-F16.gguf", "dflash-Trained-F16.gguf", "dflash-Trained-Q8_0.gguf",
                             "dflash-Trained/README.md"]
    assert files["README.md"].data.decode() == TARGET_CARD  # the target's card is left alone
    card = files["dflash-Trained/README.md"].data.decode()
    assert "](../dflash-Trained-Q8_0.gguf)" in card and "](./dflash-" not in card
    assert f"llama-server -hf {REPO}:F16 --spec-type draft-dflash" in card
    front, _ = split_front_matter(card)
    assert front["license"] == "mit" and front["dflash_gguf"]["types"] == ["F16", "Q8_0"]
    assert len(hub.commits[REPO]) == 1

    # llama.cpp, told only the repository and the quant, picks our file and drafts with it
    reply, log = _run_hf(llama_bin, hub, tmp_path, "F16")
    loaded = [ln for ln in log.splitlines() if "loading draft model" in ln]
    assert loaded and loaded[0].rstrip("'").endswith("/dflash-Trained-F16.gguf"), log[-3000:]
    cached = Path(loaded[0].split("'")[1])
    assert _sha256(cached) == files["dflash-Trained-F16.gguf"].sha256
    timings = reply["timings"]
    assert timings["draft_n"] > 0 and timings["draft_n_accepted"] > 0, timings
    assert reply["tokens_predicted"] == 48

    # the same release again: nothing is built or committed
    proc = _into(env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"nothing to do: {REPO} already holds this release"), proc.stdout
    assert len(hub.commits[REPO]) == 1
    assert _into(env, "--force").returncode == 0 and len(hub.commits[REPO]) == 2

    # a narrower set of types, redone: our earlier variants not in it go, in the same commit; others' stay
    hub.add_commit(REPO, {"dflash-Trained-Q4_0.gguf": b"someone else's"}, replace=False)
    proc = dflash_gguf("release", Path("tests/fixtures/trained/dflash").resolve(), "--into", REPO, "--types", "Q8_0",
                       "--license", "mit", "--skip-validate", "--force", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "dflash-Trained-F16.gguf removed" in proc.stdout
    files = hub.store[REPO].commits[hub.store[REPO].refs["main"]]
    assert sorted(files) == ["README.md", "Trained-F16.gguf", "dflash-Trained-Q4_0.gguf", "dflash-Trained-Q8_0.gguf",
                             "dflash-Trained/README.md"]


def test_into_refuses_a_target_from_another_repo_and_a_repo_without_models(hub, tmp_path):
    hub.add_commit(REPO, {"Trained-F16.gguf": b"GGUF", "README.md": TARGET_CARD})
    hub.add_commit("org/empty", {"README.md": TARGET_CARD})
    env = hub_env(hub, tmp_path, token=TOKEN)
    proc = _into(env, "--target", "other/Model-GGUF:Q8_0")
    assert_refused(proc, "--into org/Trained-GGUF places the drafter beside")
    proc = dflash_gguf("release", "tests/fixtures/trained/dflash", "--into", "org/empty", "--types", "F16",
                       "--skip-validate", env=env)
    assert_refused(proc, "holds no model GGUF")
    proc = dflash_gguf("release", "tests/fixtures/trained/dflash", "--into", "org/missing", "--types", "F16", env=env)
    assert_refused(proc)
    assert all(not c["path"].endswith("/commit/main") for c in hub.calls)
    proc = dflash_gguf("release", "tests/fixtures/trained/dflash", "--into", REPO, "--push", "a/b", "--types", "F16",
                       env=env)
    assert_refused(proc, "--into and --push")


@pytest.mark.integration
def test_hf_downloads_over_https(trained_pair, llama_bin, tmp_path):
    """The build speaks HTTPS (LLAMA_OPENSSL on), as the real Hub needs: the same discovery against a
    local Hub served over TLS with a self-signed certificate the server is told to trust."""
    from tests import local_hub

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    made = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                           "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                           "-out", str(cert)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    hub = local_hub.start(tls=(cert, key))
    try:
        assert hub.url.startswith("https://")
        hub.add_commit(REPO, {"Trained-F16.gguf": trained_pair["target"], "README.md": TARGET_CARD,
                              "dflash-Trained-Q8_0.gguf": trained_pair["dflash"]})
        reply, log = _run_hf(llama_bin, hub, tmp_path, "F16", SSL_CERT_FILE=str(cert))
    finally:
        local_hub.stop(hub)
    assert any(ln.rstrip("'").endswith("/dflash-Trained-Q8_0.gguf") for ln in log.splitlines()
               if "loading draft model" in ln), log[-3000:]  # the nearest quant when none matches exactly
    assert reply["timings"]["draft_n_accepted"] > 0
