"""`dflash-gguf publish` against the local stand-in for the Hub (tests/local_hub.py).

It answers the requests huggingface_hub makes for `create_repo` and `create_commit`, says every
file is a "regular" upload so the content travels inside the commit, and records each call.
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest

from tests.refusal import assert_refused

from dflash_gguf.release.publish import publish
from tests import local_hub
from tests.warm import run_cli

TOKEN = "hf_TestSecretToken0123456789abcdefXYZ"


def _env(hub: local_hub.LocalHub, tmp_path: Path, token: str | None = TOKEN) -> dict:
    return local_hub.hub_env(hub, tmp_path, token)


def _publish(*args, env: dict, verbose: bool = False) -> subprocess.CompletedProcess:
    """The real command line; `verbose` adds -v, so huggingface_hub's and our INFO log goes to stderr."""
    return run_cli([*(["-v"] if verbose else []), "publish", *args], env=env)


def tiny_gguf(path: Path, n: int, license: str | None = None) -> Path:
    """A small real GGUF (publish reads each drafter's general.license)."""
    from gguf import GGMLQuantizationType, GGUFValueType

    from dflash_gguf.gguf.format import KV, TensorInfo
    from dflash_gguf.gguf.writer import GGUFPlan, PlannedTensor, write_gguf

    plan = GGUFPlan()
    plan.add_kv([KV("general.architecture", GGUFValueType.STRING, "dflash")])
    if license is not None:
        plan.add_kv([KV("general.license", GGUFValueType.STRING, license)])
    data = bytes(range(256)) * n
    plan.tensors.append(PlannedTensor(TensorInfo("fc.weight", (len(data) // 4,), GGMLQuantizationType.F32),
                                      lambda: [data]))
    write_gguf(plan, path)
    return path


def _folder(path: Path, front: str = "license: apache-2.0\nbase_model: z-lab/x\n", extra: dict | None = None,
            gguf_license: str | None = None) -> Path:
    path.mkdir(parents=True)
    tiny_gguf(path / "dflash-Tiny-F16.gguf", 4, gguf_license)
    tiny_gguf(path / "dflash-Tiny-Q8_0.gguf", 1, gguf_license)
    (path / "LICENSE").write_text("license text\n")
    (path / ".cache").mkdir()
    (path / ".cache" / "junk").write_text("not part of the release")
    for name, data in (extra or {}).items():
        (path / name).write_text(data)
    listed = "\n".join(f"- [{p.name}](./{p.name})" for p in sorted(path.iterdir()) if not p.name.startswith("."))
    (path / "README.md").write_text(f"---\n{front}---\n# card\n\n{listed}\n")
    return path


EXPECTED = ["LICENSE", "README.md", "dflash-Tiny-F16.gguf", "dflash-Tiny-Q8_0.gguf"]


# -- dry run ----------------------------------------------------------------------------------------

def test_dry_run_lists_every_file_and_sends_nothing(hub, tmp_path):
    folder = _folder(tmp_path / "rel")
    env = _env(hub, tmp_path, token=None)
    proc = _publish(folder, "--repo", "me/tiny", "--dry-run", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith("would commit 4 files")
    for name in EXPECTED:
        size = (folder / name).stat().st_size
        assert any(line.split()[0] == name and f"{size:,}" in line for line in proc.stdout.splitlines()), name
    assert "junk" not in proc.stdout
    proc = _publish(folder, "--repo", "me/tiny", "--dry-run", "--json", env=env)
    report = json.loads(proc.stdout)
    assert report["files"] == [{"path": n, "bytes": (folder / n).stat().st_size} for n in EXPECTED]
    assert report["dry_run"] is True and report["commit_url"] is None
    assert hub.calls == []


# -- the commit ---------------------------------------------------------------------------------------

def test_publish_is_one_commit_and_the_token_never_shows(hub, tmp_path):
    folder = _folder(tmp_path / "rel")
    proc = _publish(folder, "--repo", "me/tiny", "--private", env=_env(hub, tmp_path), verbose=True)
    assert proc.returncode == 0, proc.stderr
    assert "HTTP Request: POST" in proc.stderr  # the log is on, and still
    assert TOKEN not in proc.stdout and TOKEN not in proc.stderr
    assert f"commit {hub.url}/me/tiny/commit/" in proc.stdout

    posts = [(c["method"], c["path"]) for c in hub.calls]
    assert posts[0] == ("POST", "/api/repos/create")
    assert posts.count(("POST", "/api/models/me/tiny/commit/main")) == 1
    assert posts[-1] == ("POST", "/api/models/me/tiny/commit/main")
    assert json.loads(hub.calls[0]["body"]) == {"name": "tiny", "organization": "me", "visibility": "private",
                                                "type": "model"}
    assert all(c["headers"].get("authorization") == f"Bearer {TOKEN}" for c in hub.calls)  # it was used

    (commit,) = hub.commits["me/tiny"]
    assert commit[0]["key"] == "header"
    files = {line["value"]["path"]: base64.b64decode(line["value"]["content"]) for line in commit[1:]}
    assert sorted(files) == EXPECTED
    for name, data in files.items():
        assert data == (folder / name).read_bytes()


def test_publishing_again_to_an_existing_repo(hub, tmp_path):
    folder = _folder(tmp_path / "rel")
    env = _env(hub, tmp_path)
    assert _publish(folder, "--repo", "me/tiny", env=env).returncode == 0
    proc = _publish(folder, "--repo", "me/tiny", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["commit_oid"] == f"{2:040x}" and len(hub.commits["me/tiny"]) == 2
    assert json.loads(hub.calls[0]["body"]).get("visibility") is None  # not --private: the Hub's default


def test_hub_error_is_one_line_without_the_token(hub, tmp_path):
    folder = _folder(tmp_path / "rel")
    hub.fail_commit = (403, {"error": f"token {TOKEN} has no write access to me/tiny"})
    proc = _publish(folder, "--repo", "me/tiny", env=_env(hub, tmp_path), verbose=True)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]  # -v: the log lines come first
    assert last == "error: publishing to me/tiny failed: HTTP 403: token *** has no write access to me/tiny"
    assert TOKEN not in proc.stderr and TOKEN not in proc.stdout


def test_no_token_is_refused_before_any_request(hub, tmp_path):
    proc = _publish(_folder(tmp_path / "rel"), "--repo", "me/tiny", env=_env(hub, tmp_path, token=None))
    assert_refused(proc, "no Hugging Face token", "HF_TOKEN")
    assert hub.calls == []


def test_library_call_with_an_explicit_endpoint(hub, tmp_path):
    from huggingface_hub import HfApi

    folder = _folder(tmp_path / "rel")
    result = publish(folder, "org/model", api=HfApi(endpoint=hub.url, token=TOKEN), message="first release")
    assert result.commit_url == f"{hub.url}/org/model/commit/{1:040x}"
    (commit,) = hub.commits["org/model"]
    assert commit[0]["value"]["summary"] == "first release"
    size = (folder / "dflash-Tiny-Q8_0.gguf").stat().st_size
    assert f"- dflash-Tiny-Q8_0.gguf ({size} bytes)" in commit[0]["value"]["description"]


# -- refusals: checked before the network -----------------------------------------------------------

@pytest.mark.parametrize("front, extra, needle", [
    ("license: cc-by-nc-nd-4.0\n", None, "NoDerivatives"),
    ("license: cc-by-nd-4.0\n", None, "NoDerivatives"),
    ("tags: [gguf]\n", None, "cannot be published"),
    ("license: unknown\n", None, "cannot be published"),
    ("license: llama3.1\n", None, "NOTICE"),
    ("license: other\nlicense_name: acme\nlicense_link: ACME.md\n", None, "ACME.md"),
    ("license: apache-2.0\n", {"model-F16.gguf": "x"}, "named dflash-*.gguf"),
    ("license: apache-2.0\n", {"dflash-Tiny-Q4_0-00001-of-00002.gguf": "x"}, "never split"),
])
def test_folders_that_may_not_be_published(hub, tmp_path, front, extra, needle):
    folder = _folder(tmp_path / "rel", front, extra)
    proc = _publish(folder, "--repo", "me/tiny", env=_env(hub, tmp_path))
    assert_refused(proc, needle)
    assert hub.calls == []


def test_llama_folder_with_notice_may_be_published(tmp_path):
    folder = _folder(tmp_path / "rel", "license: llama3.1\n", {"NOTICE": "Llama 3.1 is licensed under ..."})
    assert [f["path"] for f in publish(folder, "me/tiny", dry_run=True).files] == [
        "LICENSE", "NOTICE", "README.md", "dflash-Tiny-F16.gguf", "dflash-Tiny-Q8_0.gguf"]


def test_missing_readme_and_bad_repo_ids(hub, tmp_path):
    folder = _folder(tmp_path / "rel")
    (folder / "README.md").unlink()
    assert_refused(_publish(folder, "--repo", "me/tiny", "--dry-run", env=_env(hub, tmp_path)), "README.md: missing")
    for repo in ("tiny", "me/tiny/extra", "me/ti ny", "../x"):
        assert_refused(_publish(_folder(tmp_path / repo.replace("/", "_").replace(" ", "_").replace(".", "d")),
                          "--repo", repo, "--dry-run", env=_env(hub, tmp_path)), "ORG/NAME")
    assert hub.calls == []


@pytest.mark.parametrize("where", ["card", "gguf", "license-file"])
@pytest.mark.parametrize("dry_run", [True, False])
def test_a_file_holding_the_token_is_not_sent(hub, tmp_path, where, dry_run):
    """convert and release refuse to write the token; publish refuses to send a file that holds it
    anyhow (lowercased as a license id is, too), whatever the file is."""
    folded = TOKEN.lower().replace("_", "-")
    folder = _folder(tmp_path / "rel", extra={"LICENSE": f"text {TOKEN}\n"} if where == "license-file" else None,
                     gguf_license=f"mit {folded}" if where == "gguf" else None)
    if where == "card":
        (folder / "README.md").write_text((folder / "README.md").read_text() + f"debug: {TOKEN}\n")
    proc = _publish(folder, "--repo", "me/tiny", *(["--dry-run"] if dry_run else []), env=_env(hub, tmp_path))
    assert_refused(proc, "holds the Hugging Face token", "it is not sent")
    assert TOKEN not in proc.stdout + proc.stderr
    assert hub.calls == []


def test_a_sparse_huge_license_file_is_not_sent(hub, tmp_path):
    folder = _folder(tmp_path / "rel")
    with open(folder / "LICENSE", "r+b") as fh:
        fh.truncate(2 << 30)
    assert_refused(_publish(folder, "--repo", "me/tiny", env=_env(hub, tmp_path)), "LICENSE: this release file", "MiB")
    assert hub.calls == []


def test_a_file_whose_sha256_differs_from_the_cards_is_refused(hub, tmp_path):
    """The card's Files table records each variant's sha256; a file replaced since is never sent."""
    import hashlib

    folder = _folder(tmp_path / "rel")
    gguf = folder / "dflash-Tiny-Q8_0.gguf"
    recorded = hashlib.sha256(gguf.read_bytes()).hexdigest()
    card = folder / "README.md"
    card.write_text(card.read_text() + f"\n| File | SHA-256 |\n|---|---|\n| [{gguf.name}](./{gguf.name}) | `{recorded}` |\n")
    env = _env(hub, tmp_path)
    assert _publish(folder, "--repo", "me/tiny", "--dry-run", env=env).returncode == 0  # as recorded: fine
    tiny_gguf(gguf, 2)  # another file in its place
    assert_refused(_publish(folder, "--repo", "me/tiny", env=env), gguf.name, "sha256", recorded)
    assert not hub.commits


@pytest.mark.parametrize("ignored", [{"README.md", "LICENSE"}, {"LICENSE"}, {"dflash-Tiny-F16.gguf"}])
def test_a_hub_that_would_ignore_a_release_file_gets_no_commit(hub, tmp_path, ignored):
    """huggingface_hub's create_commit leaves out what the pre-upload answers `shouldIgnore` for (a
    .gitignore rule) and still succeeds: a repository without its card or license."""
    folder = _folder(tmp_path / "rel")
    hub.ignored = ignored
    proc = _publish(folder, "--repo", "me/tiny", env=_env(hub, tmp_path))
    assert_refused(proc, "me/tiny", "ignore", sorted(ignored)[0], ".gitignore", "nothing was committed")
    assert ("POST", "/api/models/me/tiny/preupload/main") in [(c["method"], c["path"]) for c in hub.calls]
    assert not hub.commits.get("me/tiny")


def test_a_token_file_that_is_a_fifo_is_refused_not_waited_on(hub, tmp_path):
    import os

    folder = _folder(tmp_path / "rel")
    env = _env(hub, tmp_path, token=None)
    (tmp_path / "hf-home").mkdir()
    os.mkfifo(tmp_path / "hf-home" / "token")
    proc = run_cli(["publish", folder, "--repo", "me/tiny"], env=env, timeout=60)
    assert_refused(proc, str(tmp_path / "hf-home" / "token"), "not a regular file", "HF_TOKEN")
    assert not hub.calls


def test_time_between_library_calls_is_not_hub_traffic(hub, tmp_path, monkeypatch):
    """The command clock (COMMAND_TIMEOUTS request deadlines) runs only while a request is in flight: a
    process that publishes twice, with its own work between (a test worker, a library caller), is not
    refused for the time in between (once it was, 600 s after its first request)."""
    import time

    from huggingface_hub import HfApi

    from dflash_gguf.hub import transport

    monkeypatch.setenv(transport.TIMEOUT_ENV, "0.5")  # the command's budget: 10 x 0.5 s
    monkeypatch.setattr(transport, "_command", [])
    publish(_folder(tmp_path / "rel"), "org/model", api=HfApi(endpoint=hub.url, token=TOKEN), message="first")
    time.sleep(6)  # more than the whole budget, spent outside any request
    publish(_folder(tmp_path / "rel2"), "org/model", api=HfApi(endpoint=hub.url, token=TOKEN), message="second")
    assert [c[0]["value"]["summary"] for c in hub.commits["org/model"]] == ["first", "second"]
    assert transport._command[0].active == 0  # every request finished with its clock
