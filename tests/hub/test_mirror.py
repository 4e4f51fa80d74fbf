"""Hub mirrors and old caches (dflash_gguf/hub/resolve.py): repo ids read through PyPI `olah` serving local git
repositories offline (tests/hub/olah_hub.py), and Hugging Face caches without huggingface_hub's cached
tree listing, read offline from the snapshot folder itself.

The olah tests skip without the `test-mirror` extra (`pip install -e '.[test-mirror]'`; `make test`
installs it); the cache tests use the local Hub stand-in (tests/local_hub.py) and always run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import re

import pytest

from dflash_gguf.gguf.reader import GGUFFile
from tests.conftest import dflash_gguf
from tests.refusal import assert_refused
from training.fixtures.gguf_compare import differences
from tests.local_hub import Blob, hub_env

CLASS_NAME = re.compile(r"\b(?:[A-Z][a-z0-9]+)+(?:Error|Exception)\b")
PROVENANCE = ("general.source.repo_url", "general.source.revision", "general.base_model.0.repo_url",
              "general.base_model.0.revision", "general.base_model.0.name", "general.base_model.count")


def _same_but_provenance(ours: Path, local: Path) -> None:
    """`ours` is the local conversion byte for byte in every tensor and key but where it came from."""
    assert differences(ours, local) == []
    with GGUFFile(ours) as a, GGUFFile(local) as b:
        assert {k: v.encoded() for k, v in a.kv.items() if k not in PROVENANCE} == \
               {k: v.encoded() for k, v in b.kv.items() if k not in PROVENANCE}
        assert [(t.name, t.offset) for t in a.tensors.values()] == [(t.name, t.offset) for t in b.tensors.values()]


@pytest.fixture(scope="module")
def local_conversions(fixtures, target_gguf, tmp_path_factory) -> dict[str, Path]:
    """The fixture drafters converted from local folders named as their repositories are."""
    folder = tmp_path_factory.mktemp("local")
    shutil.copytree(fixtures / "target-hf", folder / "tiny-target")
    out = {}
    for name, drafter, repo_name, target in (
            ("dflash-b16", "dflash-b16", "tiny-dflash", target_gguf),
            ("dflash-b16-hf", "dflash-b16", "tiny-dflash", folder / "tiny-target"),
            ("dflash-swa-hf", "dflash-swa", "tiny-dflash", folder / "tiny-target"),
            ("dflash-sharded", "dflash-sharded", "tiny-dflash-sharded", folder / "tiny-target")):
        if not (folder / drafter / repo_name).exists():
            shutil.copytree(fixtures / drafter, folder / drafter / repo_name)
        out[name] = folder / f"{name}.gguf"
        proc = dflash_gguf("convert", folder / drafter / repo_name, "--target", target, "-o", out[name])
        assert proc.returncode == 0, proc.stderr
    return out


# -- olah: a real mirror ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def olah(fixtures, target_gguf, tmp_path_factory):
    pytest.importorskip("olah", reason="needs the test-mirror extra: pip install -e '.[test-mirror]'")
    from tests.hub.olah_hub import OlahMirror

    mirror = OlahMirror(tmp_path_factory.mktemp("olah"))
    mirror.shas = {"v1": mirror.add_folder("z-lab/tiny-dflash", fixtures / "dflash-b16")}
    mirror.tag("z-lab/tiny-dflash", "v1")
    mirror.shas["main"] = mirror.add_folder("z-lab/tiny-dflash", fixtures / "dflash-swa")  # main moved on
    mirror.add_folder("z-lab/tiny-dflash-sharded", fixtures / "dflash-sharded")
    mirror.add_folder("Qwen/tiny-target", fixtures / "target-hf")
    gguf_folder = tmp_path_factory.mktemp("gguf-repo")
    shutil.copy(target_gguf, gguf_folder / "tiny-target-F16.gguf")
    mirror.shas["gguf"] = mirror.add_folder("org/tiny-target-GGUF", gguf_folder,
                                            {"README.md": "---\nlicense: apache-2.0\n---\n"})
    with mirror.running():
        yield mirror


def test_a_gguf_target_through_olah_reads_its_metadata_only(olah, target_gguf, local_conversions, tmp_path):
    env = olah.env(tmp_path / "hf")
    out = tmp_path / "olah.gguf"
    proc = dflash_gguf("-v", "convert", "z-lab/tiny-dflash@v1", "--target", "org/tiny-target-GGUF:F16",
                       "-o", out, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    _same_but_provenance(out, local_conversions["dflash-b16"])
    assert "ignored the byte range" in proc.stderr  # olah answered 200 to every range request

    t = json.loads(proc.stdout)["target"]
    with GGUFFile(target_gguf) as f:
        assert (t["metadata_bytes"], t["file_bytes"]) == (f.data_offset, f.size)
    assert t["metadata_bytes"] <= t["bytes_fetched"] < 2 * t["metadata_bytes"], t
    assert t["bytes_fetched"] < t["file_bytes"]  # the stream was hung up before the tensors

    with GGUFFile(out) as f:  # provenance names the mirror it was read from, and the exact commits
        assert f.get("general.source.repo_url") == f"{olah.url}/z-lab/tiny-dflash"
        assert f.get("general.source.revision") == olah.shas["v1"]
        assert f.get("general.base_model.0.repo_url") == f"{olah.url}/org/tiny-target-GGUF"
        assert f.get("general.base_model.0.revision") == olah.shas["gguf"]


def test_repo_ids_and_revisions_through_olah(olah, fixtures, local_conversions, tmp_path):
    env = olah.env(tmp_path / "hf")
    out = tmp_path / "sharded.gguf"
    proc = dflash_gguf("convert", "z-lab/tiny-dflash-sharded", "--target", "Qwen/tiny-target", "-o", out, env=env)
    assert proc.returncode == 0, proc.stderr
    _same_but_provenance(out, local_conversions["dflash-sharded"])

    # no revision means main (which moved on from v1); offline, the same from the cache
    for offline in ("0", "1"):
        out = tmp_path / f"main-{offline}.gguf"
        proc = dflash_gguf("convert", "z-lab/tiny-dflash", "--target", fixtures / "target-hf", "-o", out,
                           env={**env, "HF_HUB_OFFLINE": offline})
        assert proc.returncode == 0, proc.stderr
        _same_but_provenance(out, local_conversions["dflash-swa-hf"])
        with GGUFFile(out) as f:
            assert f.get("general.source.revision") == olah.shas["main"]


@pytest.mark.parametrize("drafter, needles", [
    ("z-lab/tiny-dflash@v404", ["z-lab/tiny-dflash@v404", "revision 'v404' not found in z-lab/tiny-dflash"]),
    ("z-lab/tiny-dflash@" + "0" * 40, ["revision '" + "0" * 40 + "' not found"]),
    ("z-lab/missing", ["no repository z-lab/missing on http://127.0.0.1:"]),
    ("z-lab/missing@v1", ["no repository z-lab/missing"]),
])
def test_olah_errors_are_one_line_in_our_words(olah, fixtures, tmp_path, drafter, needles):
    out = tmp_path / "x.gguf"
    proc = dflash_gguf("convert", drafter, "--target", fixtures / "target-hf", "-o", out,
                       env=olah.env(tmp_path / "hf"))
    assert_refused(proc, *needles)
    assert not out.exists()


# -- the local Hub stand-in: a server that ignores ranges, old caches ---------------------------------

def test_a_server_ignoring_ranges_is_read_as_a_stream_and_hung_up(hub, fixtures, target_gguf, tmp_path,
                                                                  local_conversions):
    from tests.hub.test_hub import _virtual_gguf

    head, size = _virtual_gguf(target_gguf)  # 4.9 GB behind the metadata
    hub.add_folder("z-lab/tiny-dflash", fixtures / "dflash-b16")
    hub.add_commit("org/big-GGUF", {"big-Q4_K_M.gguf": Blob(head, size, "ab" * 32)})
    hub.ignore_ranges = True
    out = tmp_path / "x.gguf"
    proc = dflash_gguf("convert", "z-lab/tiny-dflash", "-t", "org/big-GGUF:Q4_K_M", "-o", out, "--json",
                       env=hub_env(hub, tmp_path))
    assert proc.returncode == 0, proc.stderr
    _same_but_provenance(out, local_conversions["dflash-b16"])
    t = json.loads(proc.stdout)["target"]
    assert t["requests"] == 1 and len(head) <= t["bytes_fetched"] < 2 * len(head), t
    assert hub.bytes_sent("/_lfs/" + "ab" * 32) < 64 * 2**20  # the client hung up; not 4.9 GB
    # model info is always asked at a revision (a mirror refuses the bare form)
    infos = [c["path"] for c in hub.calls if c["path"].startswith("/api/models/") and "/tree/" not in c["path"]]
    assert infos and all("/revision/" in p for p in infos), infos


def _fetch(hub, tmp_path: Path, how: str, repo: str, files: list[str]) -> None:
    """Put `files` of `repo` in the cache as `how` leaves them: `hf_hub_download` one file at a time
    (refs, snapshots and blobs, no tree listing), or `snapshot_download` (with its tree listing)."""
    code = ("import sys; from huggingface_hub import hf_hub_download, snapshot_download as s; r, fs = sys.argv[1], "
            "sys.argv[2:]; " + ("[hf_hub_download(r, f) for f in fs]" if how == "files" else "s(r, allow_patterns=fs)"))
    subprocess.run([sys.executable, "-c", code, repo, *files], env=hub_env(hub, tmp_path), check=True)


def test_a_cache_without_a_tree_listing_is_read_offline(hub, fixtures, tmp_path, local_conversions):
    hub.add_folder("z-lab/tiny-dflash", fixtures / "dflash-b16")
    hub.add_folder("Qwen/tiny-target", fixtures / "target-hf")
    _fetch(hub, tmp_path, "files", "z-lab/tiny-dflash", ["config.json", "model.safetensors"])
    _fetch(hub, tmp_path, "files", "Qwen/tiny-target",
           ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"])
    assert not list((tmp_path / "hf-home" / "hub").glob("models--*/trees"))  # as an older huggingface_hub left it
    calls = len(hub.calls)
    out = tmp_path / "offline.gguf"
    proc = dflash_gguf("convert", "z-lab/tiny-dflash", "--target", "Qwen/tiny-target", "-o", out,
                       env=hub_env(hub, tmp_path, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr
    assert len(hub.calls) == calls  # not one request
    _same_but_provenance(out, local_conversions["dflash-b16-hf"])


def test_an_incomplete_cached_snapshot_offline_is_one_line(hub, fixtures, tmp_path):
    hub.add_folder("z-lab/tiny-dflash", fixtures / "dflash-b16")
    _fetch(hub, tmp_path, "snapshot", "z-lab/tiny-dflash", ["config.json", "model.safetensors"])
    (config,) = (tmp_path / "hf-home" / "hub").glob("models--z-lab--tiny-dflash/snapshots/*/config.json")
    config.unlink()  # the tree listing says the snapshot has it; the disk does not
    out = tmp_path / "x.gguf"
    proc = dflash_gguf("convert", "z-lab/tiny-dflash", "-t", fixtures / "target-hf", "-o", out,
                       env=hub_env(hub, tmp_path, HF_HUB_OFFLINE="1"))
    assert_refused(proc, "z-lab/tiny-dflash", "HF_HUB_OFFLINE=1", "run once online")
    assert not out.exists()


def test_the_endpoint_recorded_never_carries_a_password(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_ENDPOINT"] = "http://mirror-user:s3cret-long@127.0.0.1:8090/"
    code = "from dflash_gguf.hub.resolve import HubSource; print(HubSource('o/n', 'a' * 40).url)"
    shown = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert shown.strip() == "http://127.0.0.1:8090/o/n"
