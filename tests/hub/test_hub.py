"""Models named by Hub repo id (dflash_gguf/hub/resolve.py), against the local Hub stand-in (tests/local_hub.py).

Every command here is the real command line in a subprocess whose HF_ENDPOINT is the local Hub and
whose HF_HOME starts empty; the Hub records every request, so the tests check what was fetched.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as QT

from dflash_gguf import __version__
from dflash_gguf.gguf.format import TensorInfo
from dflash_gguf.gguf.reader import GGUFFile
from dflash_gguf.gguf.writer import GGUFPlan, PlannedTensor, encode_header
from dflash_gguf.licenses import split_front_matter
from dflash_gguf.owned_folder import MANIFEST
from tests.conftest import dflash_gguf
from tests.refusal import assert_refused
from training.fixtures.gguf_compare import differences
from tests.local_hub import Blob, LocalHub, hub_env

TOKEN = "hf_LocalHubToken0123456789"
TARGET_FOLDER_FILES = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}


def _serve(hub: LocalHub, fixtures: Path, target_gguf: Path) -> dict[str, str]:
    """The fixture models as Hub repositories; returns each repository's commit sha."""
    shas = {
        "z-lab/tiny-dflash": hub.add_folder("z-lab/tiny-dflash", fixtures / "dflash-b16"),
        "z-lab/tiny-dflash-sharded": hub.add_folder("z-lab/tiny-dflash-sharded", fixtures / "dflash-sharded"),
        "Qwen/tiny-target": hub.add_folder("Qwen/tiny-target", fixtures / "target-hf"),
        "org/tiny-target-GGUF": hub.add_commit("org/tiny-target-GGUF", {
            "tiny-target-F16.gguf": target_gguf,
            "dflash-tiny-target-F16.gguf": b"a drafter sidecar, never the target",
            "README.md": "---\nlicense: apache-2.0\n---\n"}),
    }
    shas["z-lab/tiny-dflash"] = hub.add_commit("z-lab/tiny-dflash", {
        "README.md": "---\nlicense: mit\n---\n# tiny drafter\n", "LICENSE": "MIT (text)\n",
        "training-notes.txt": "not read by the converter, so never fetched\n"}, replace=False)
    return shas


def _convert(hub: LocalHub, tmp_path: Path, *args, cwd: Path | None = None, **env_extra):
    return dflash_gguf("convert", *args, cwd=cwd, env=hub_env(hub, tmp_path, **env_extra))


def _local(tmp_path: Path, fixtures: Path, drafter: str, target: Path, name: str) -> Path:
    """The same conversion from local paths."""
    out = tmp_path / f"local-{name}.gguf"
    if out.exists():
        return out
    proc = dflash_gguf("convert", fixtures / drafter, "--target", target, "-o", out)
    assert proc.returncode == 0, proc.stderr
    return out


def _fetched(hub: LocalHub, repo: str) -> set[str]:
    """Files of `repo` whose content was sent (GET on resolve, or its CDN object)."""
    files = {}
    for sha_files in hub.store[repo].commits.values():
        files.update({blob.sha256: path for path, blob in sha_files.items()})
    out = set()
    for c in hub.calls:
        if c["method"] != "GET" or c["sent"] == 0:
            continue
        if f"/{repo}/resolve/" in c["path"]:
            out.add(c["path"].split("/resolve/", 1)[1].split("/", 1)[1])
        elif c["cdn"] and c["path"].split("/")[-1] in files:
            out.add(files[c["path"].split("/")[-1]])
    return out


# -- part 1: repo ids in ----------------------------------------------------------------------------

def test_repo_ids_convert_like_local_paths(hub, fixtures, target_gguf, tmp_path):
    shas = _serve(hub, fixtures, target_gguf)
    out = tmp_path / "hub.gguf"
    proc = _convert(hub, tmp_path, "z-lab/tiny-dflash", "--target", "org/tiny-target-GGUF:f16", "-o", out, "--json")
    assert proc.returncode == 0, proc.stderr
    assert differences(out, _local(tmp_path, fixtures, "dflash-b16", target_gguf, "b16")) == []

    # only the drafter's config and weights came down; the target GGUF was read by ranges, never whole
    assert _fetched(hub, "z-lab/tiny-dflash") == {"config.json", "model.safetensors", "README.md", "LICENSE"}
    gguf_object = "/_lfs/" + hub.store["org/tiny-target-GGUF"].commits[shas["org/tiny-target-GGUF"]][
        "tiny-target-F16.gguf"].sha256
    gguf_reads = [c for c in hub.calls if c["path"] == gguf_object and c["method"] == "GET"]
    assert gguf_reads and all(c["headers"].get("range") for c in gguf_reads)
    assert not any(c["headers"].get("authorization") for c in gguf_reads)  # no token to the CDN

    report = json.loads(proc.stdout)
    t = report["target"]
    assert (t["repo"], t["revision"], t["file"]) == ("org/tiny-target-GGUF", shas["org/tiny-target-GGUF"],
                                                     "tiny-target-F16.gguf")
    assert t["bytes_fetched"] == sum(c["sent"] for c in gguf_reads)
    with GGUFFile(target_gguf) as f:
        assert t["metadata_bytes"] == f.data_offset and t["file_bytes"] == f.size
    assert f.data_offset <= t["bytes_fetched"] < 2 * f.data_offset

    # provenance: both repositories and their exact commits
    with GGUFFile(out) as f:
        # the endpoint actually read from (HF_ENDPOINT, here the local Hub), not the public Hub
        assert f.get("general.source.repo_url") == f"{hub.url}/z-lab/tiny-dflash"
        assert f.get("general.source.revision") == shas["z-lab/tiny-dflash"]
        assert f.get("general.base_model.0.repo_url") == f"{hub.url}/org/tiny-target-GGUF"
        assert f.get("general.base_model.0.revision") == shas["org/tiny-target-GGUF"]
        assert f.get("general.name") == "tiny-dflash"  # the repo's name, not the snapshot's sha
    assert report["drafter"]["revision"] == shas["z-lab/tiny-dflash"]
    # and inspect shows where the file came from
    shown = dflash_gguf("inspect", out).stdout
    assert f"drafter from    {hub.url}/z-lab/tiny-dflash @ {shas['z-lab/tiny-dflash']}" in shown
    assert f"target from     {hub.url}/org/tiny-target-GGUF @ {shas['org/tiny-target-GGUF']}" in shown
    assert json.loads(dflash_gguf("inspect", out, "--json").stdout)["sources"]["target"]["revision"] == \
        shas["org/tiny-target-GGUF"]


def test_target_repo_fetches_config_and_tokenizer_only(hub, fixtures, target_gguf, tmp_path):
    _serve(hub, fixtures, target_gguf)
    out = tmp_path / "hub.gguf"
    proc = _convert(hub, tmp_path, "z-lab/tiny-dflash-sharded", "--target", "Qwen/tiny-target", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert differences(out, _local(tmp_path, fixtures, "dflash-sharded", fixtures / "target-hf", "sharded")) == []
    assert _fetched(hub, "Qwen/tiny-target") == TARGET_FOLDER_FILES  # not its 19 MB of weights
    assert _fetched(hub, "z-lab/tiny-dflash-sharded") == {
        "config.json", "model.safetensors.index.json", "weights-part-a.safetensors", "weights-part-b.safetensors"}


def _virtual_gguf(target_gguf: Path) -> tuple[bytes, int]:
    """The tiny target's metadata in front of 4.9 GB of (never stored) tensors of an 8B-sized model."""
    with GGUFFile(target_gguf) as f:
        plan = GGUFPlan(kv=list(f.kv.values()))
        plan.tensors = [PlannedTensor(TensorInfo(t.name, t.shape, t.type), None) for t in f.tensors.values()]
    plan.tensors += [PlannedTensor(TensorInfo(f"blk.{i}.ffn_big.weight", (12288, 4096), QT.F16), None)
                     for i in range(48)]
    head = encode_header(plan)
    return head, len(head) + sum(-(-t.info.nbytes // 32) * 32 for t in plan.tensors)


def test_multi_gb_target_gguf_costs_its_metadata_only(hub, fixtures, target_gguf, tmp_path):
    head, size = _virtual_gguf(target_gguf)
    assert size > 4 * 2**30
    hub.add_folder("z-lab/tiny-dflash", fixtures / "dflash-b16")
    hub.add_commit("org/big-GGUF", {"big-Q4_K_M.gguf": Blob(head, size, "ab" * 32),
                                    "big-Q8_0.gguf": Blob(head, size, "cd" * 32)})
    out = tmp_path / "big.gguf"
    proc = _convert(hub, tmp_path, "z-lab/tiny-dflash", "--target", "org/big-GGUF:Q4_K_M", "-o", out, "--json")
    assert proc.returncode == 0, proc.stderr
    t = json.loads(proc.stdout)["target"]
    served = hub.bytes_sent("/_lfs/" + "ab" * 32)
    assert t["file_bytes"] == size and t["bytes_fetched"] == served
    assert len(head) <= served < 2 * len(head), (served, len(head))
    assert hub.bytes_sent("/_lfs/" + "cd" * 32) == 0
    assert differences(out, _local(tmp_path, fixtures, "dflash-b16", target_gguf, "b16")) == []


def test_a_revision_pins_the_commit(hub, fixtures, target_gguf, tmp_path):
    first = hub.add_folder("z-lab/tiny-dflash", fixtures / "dflash-b16")
    hub.tag("z-lab/tiny-dflash", "v1", first)
    later = hub.add_folder("z-lab/tiny-dflash", fixtures / "dflash-swa")  # main moved on: same name, new weights
    for spec, sha, drafter in (("z-lab/tiny-dflash@v1", first, "dflash-b16"),
                               (f"z-lab/tiny-dflash@{first}", first, "dflash-b16"),
                               ("z-lab/tiny-dflash", later, "dflash-swa")):
        out = tmp_path / f"{sha[:8]}-{spec.count('@')}-{spec[-2:]}.gguf"
        proc = _convert(hub, tmp_path, spec, "--target", target_gguf, "-o", out)
        assert proc.returncode == 0, proc.stderr
        with GGUFFile(out) as f:
            assert f.get("general.source.revision") == sha, spec
        assert differences(out, _local(tmp_path, fixtures, drafter, target_gguf, drafter)) == []


def test_offline_runs_from_the_cache(hub, fixtures, target_gguf, tmp_path):
    _serve(hub, fixtures, target_gguf)
    online = tmp_path / "online.gguf"
    assert _convert(hub, tmp_path, "z-lab/tiny-dflash", "-t", "Qwen/tiny-target", "-o", online).returncode == 0
    calls = len(hub.calls)
    offline = tmp_path / "offline.gguf"
    proc = _convert(hub, tmp_path, "z-lab/tiny-dflash", "-t", "Qwen/tiny-target", "-o", offline, HF_HUB_OFFLINE="1")
    assert proc.returncode == 0, proc.stderr
    assert len(hub.calls) == calls  # not one request
    assert offline.read_bytes() == online.read_bytes()

    # a GGUF never cached cannot be read offline, and nothing is written
    out = tmp_path / "x.gguf"
    assert_refused(_convert(hub, tmp_path, "z-lab/tiny-dflash", "-t", "org/tiny-target-GGUF:F16", "-o", out,
                            HF_HUB_OFFLINE="1"), "org/tiny-target-GGUF:F16", "HF_HUB_OFFLINE=1", out=out)
    # nor anything offline with an empty cache
    assert_refused(_convert(hub, tmp_path / "empty", "z-lab/tiny-dflash", "-t", target_gguf, "-o", out,
                            HF_HUB_OFFLINE="1"), "z-lab/tiny-dflash", "HF_HUB_OFFLINE=1", out=out)
    assert len(hub.calls) == calls


def test_a_cached_target_gguf_is_used_from_the_cache(hub, fixtures, target_gguf, tmp_path):
    _serve(hub, fixtures, target_gguf)
    subprocess.run([sys.executable, "-c", "from huggingface_hub import hf_hub_download as d; "
                    "d('org/tiny-target-GGUF', 'tiny-target-F16.gguf')"], env=hub_env(hub, tmp_path), check=True)
    before = hub.bytes_sent("/_lfs/" + Blob(target_gguf.read_bytes()).sha256)
    out = tmp_path / "cached.gguf"
    proc = _convert(hub, tmp_path, "z-lab/tiny-dflash", "-t", "org/tiny-target-GGUF:F16", "-o", out, "--json")
    assert proc.returncode == 0, proc.stderr
    assert hub.bytes_sent("/_lfs/" + Blob(target_gguf.read_bytes()).sha256) == before  # no range reads
    t = json.loads(proc.stdout)["target"]
    assert "bytes_fetched" not in t and t["path"].endswith("tiny-target-F16.gguf") and Path(t["path"]).is_file()
    with GGUFFile(out) as f:
        assert f.get("general.base_model.0.repo_url") == f"{hub.url}/org/tiny-target-GGUF"
    calls = len(hub.calls)
    offline = tmp_path / "offline.gguf"
    proc = _convert(hub, tmp_path, "z-lab/tiny-dflash", "-t", "org/tiny-target-GGUF:F16", "-o", offline,
                    HF_HUB_OFFLINE="1")
    assert proc.returncode == 0, proc.stderr
    assert len(hub.calls) == calls and offline.read_bytes() == out.read_bytes()


def test_range_requests_are_retried_then_refused_in_one_line(hub, fixtures, target_gguf, tmp_path):
    from dflash_gguf.hub.resolve import RANGE_RETRIES

    _serve(hub, fixtures, target_gguf)
    local = _local(tmp_path, fixtures, "dflash-b16", target_gguf, "b16")
    out = tmp_path / "retried.gguf"
    hub.fail_ranges = [503, "drop", 429]  # three failures on the first range, each retried
    proc = _convert(hub, tmp_path, "z-lab/tiny-dflash", "-t", "org/tiny-target-GGUF:F16", "-o", out, "--json")
    assert proc.returncode == 0, proc.stderr
    assert hub.fail_ranges == [] and differences(out, local) == []
    target = json.loads(proc.stdout)["target"]
    assert target["requests"] >= 4  # the three failed tries are counted

    out = tmp_path / "refused.gguf"
    hub.fail_ranges = [503] * (RANGE_RETRIES + 1)
    assert_refused(_convert(hub, tmp_path, "z-lab/tiny-dflash", "-t", "org/tiny-target-GGUF:F16", "-o", out), "503", out=out)
    hub.fail_ranges = ["drop"] * (RANGE_RETRIES + 1)
    assert_refused(_convert(hub, tmp_path, "z-lab/tiny-dflash", "-t", "org/tiny-target-GGUF:F16", "-o", out),
                   f"failed {RANGE_RETRIES + 1} times", out=out)


def test_a_local_path_wins_over_a_repo_id(hub, fixtures, target_gguf, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(fixtures / "dflash-swa", work / "z-lab" / "tiny-dflash")  # same spelling, other model
    out = tmp_path / "local.gguf"
    proc = _convert(hub, tmp_path, "z-lab/tiny-dflash", "-t", target_gguf, "-o", out, cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert hub.calls == []
    assert differences(out, _local(tmp_path, fixtures, "dflash-swa", target_gguf, "swa")) == []
    with GGUFFile(out) as f:
        assert f.get("general.source.revision") is None


# -- part 6: errors a user can act on ------------------------------------------------------------

@pytest.mark.parametrize("drafter, target, token, needles", [
    ("z-lab/missing", "T", None, ["z-lab/missing", "no repository z-lab/missing"]),
    ("gated/tiny-dflash", "T", None, ["gated/tiny-dflash", "gated repository", "no token is set", "HF_TOKEN"]),
    ("gated/tiny-dflash", "T", "hf_SomeoneElse", ["gated repository", "no access"]),
    ("z-lab/tiny-dflash@v404", "T", None, ["z-lab/tiny-dflash@v404", "revision 'v404' not found"]),
    ("z-lab/tiny-dflash", "org/tiny-target-GGUF:Q5_K_M", None, ["no GGUF file for quant Q5_K_M", "available: F16"]),
    ("z-lab/tiny-dflash", "org/tiny-target-GGUF/sub/none.gguf", None, ["no file sub/none.gguf"]),
    ("z-lab/tiny-dflash", "org/tiny-target-GGUF", None, ["no config.json", "owner/name:QUANT"]),
])
def test_hub_errors_are_one_line(hub, fixtures, target_gguf, tmp_path, drafter, target, token, needles):
    _serve(hub, fixtures, target_gguf)
    hub.add_folder("gated/tiny-dflash", fixtures / "dflash-b16", gated=True, allowed_tokens=(TOKEN,))
    out = tmp_path / "out" / "x.gguf"
    out.parent.mkdir()
    env = {"HF_TOKEN": token} if token else {}
    proc = _convert(hub, tmp_path, drafter, "-t", target_gguf if target == "T" else target, "-o", out, **env)
    assert_refused(proc, *needles, out=out)
    assert not (token and token in proc.stderr)


def test_gated_repo_with_access(hub, fixtures, target_gguf, tmp_path):
    sha = hub.add_folder("gated/tiny-dflash", fixtures / "dflash-b16", gated=True, allowed_tokens=(TOKEN,))
    out = tmp_path / "gated.gguf"
    proc = _convert(hub, tmp_path, "gated/tiny-dflash", "-t", target_gguf, "-o", out, HF_TOKEN=TOKEN)
    assert proc.returncode == 0, proc.stderr
    assert TOKEN not in proc.stderr + proc.stdout
    with GGUFFile(out) as f:
        assert f.get("general.source.revision") == sha


def test_neither_a_path_nor_a_repo_id(hub, tmp_path, target_gguf):
    proc = _convert(hub, tmp_path, "no/such/folder", "-t", target_gguf, "-o", tmp_path / "x.gguf")
    assert_refused(proc, "not a Hub repo id", out=tmp_path / "x.gguf")
    proc = _convert(hub, tmp_path, "z-lab/x:Q4_K_M", "-t", target_gguf, "-o", tmp_path / "x.gguf")
    assert_refused(proc, "names a GGUF file on the Hub", out=tmp_path / "x.gguf")
    assert hub.calls == []


# -- part 3: provenance in the release ----------------------------------------------------------------

def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_release_from_repo_ids_records_its_sources(hub, fixtures, target_gguf, tmp_path):
    shas = _serve(hub, fixtures, target_gguf)
    rel = tmp_path / "rel"
    proc = dflash_gguf("release", "z-lab/tiny-dflash", "-t", "org/tiny-target-GGUF:F16", "--types", "F16",
                       "-o", rel, "--target-license", "apache-2.0", "--json", env=hub_env(hub, tmp_path))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert sorted(p.name for p in rel.iterdir() if p.name != MANIFEST) == ["LICENSE", "README.md",
                                                                        "dflash-tiny-target-F16.gguf"]
    (variant,) = report["variants"]
    assert "read on the Hub without downloading it" in variant["validation"]["note"]

    front, body = split_front_matter((rel / "README.md").read_text(encoding="utf-8"))
    assert front["license"] == "mit" and front["base_model"] == "z-lab/tiny-dflash"
    assert front["dflash_gguf"] == {
        "version": __version__, "types": ["F16"],
        "drafter": {"repo": "z-lab/tiny-dflash", "revision": shas["z-lab/tiny-dflash"],
                    "files": {"config.json": _sha256(fixtures / "dflash-b16" / "config.json"),
                              "model.safetensors": _sha256(fixtures / "dflash-b16" / "model.safetensors")}},
        "target": {"repo": "org/tiny-target-GGUF", "revision": shas["org/tiny-target-GGUF"],
                   "file": "tiny-target-F16.gguf", "files": {"tiny-target-F16.gguf": _sha256(target_gguf)}},
    }
    rows = [line for line in body.splitlines() if line.startswith(("| drafter |", "| target |"))]
    assert len(rows) == 3
    assert all(shas["z-lab/tiny-dflash"] in r for r in rows[:2])
    assert f"| target | [org/tiny-target-GGUF](https://huggingface.co/org/tiny-target-GGUF/tree/" \
           f"{shas['org/tiny-target-GGUF']}) | `{shas['org/tiny-target-GGUF']}` | tiny-target-F16.gguf | " \
           f"`{_sha256(target_gguf)}` |" in rows
    with GGUFFile(rel / "dflash-tiny-target-F16.gguf") as f:
        assert f.get("general.source.revision") == shas["z-lab/tiny-dflash"]
        assert f.get("general.base_model.0.revision") == shas["org/tiny-target-GGUF"]


def test_release_with_a_target_folder_repo_hashes_what_it_read(hub, fixtures, target_gguf, tmp_path):
    shas = _serve(hub, fixtures, target_gguf)
    rel = tmp_path / "rel"
    proc = dflash_gguf("release", "z-lab/tiny-dflash-sharded@" + shas["z-lab/tiny-dflash-sharded"],
                       "-t", "Qwen/tiny-target", "--types", "F16", "-o", rel, "--license", "mit",
                       "--target-license", "apache-2.0", "--skip-validate", env=hub_env(hub, tmp_path))
    assert proc.returncode == 0, proc.stderr
    front, _ = split_front_matter((rel / "README.md").read_text(encoding="utf-8"))
    prov = front["dflash_gguf"]
    assert prov["target"]["revision"] == shas["Qwen/tiny-target"]
    assert prov["target"]["files"] == {n: _sha256(fixtures / "target-hf" / n) for n in sorted(TARGET_FOLDER_FILES)}
    assert prov["drafter"]["files"] == {n: _sha256(fixtures / "dflash-sharded" / n) for n in (
        "config.json", "model.safetensors.index.json", "weights-part-a.safetensors", "weights-part-b.safetensors")}
    assert _fetched(hub, "Qwen/tiny-target") == TARGET_FOLDER_FILES


def test_release_from_local_paths_records_hashes_without_a_revision(fixtures, target_gguf, tmp_path):
    rel = tmp_path / "rel"
    proc = dflash_gguf("release", fixtures / "dflash-b16", "-t", target_gguf, "--types", "F16", "-o", rel,
                       "--license", "mit", "--target-license", "apache-2.0", "--skip-validate")
    assert proc.returncode == 0, proc.stderr
    front, body = split_front_matter((rel / "README.md").read_text(encoding="utf-8"))
    assert front["dflash_gguf"]["drafter"] == {"files": {
        "config.json": _sha256(fixtures / "dflash-b16" / "config.json"),
        "model.safetensors": _sha256(fixtures / "dflash-b16" / "model.safetensors")}}
    assert front["dflash_gguf"]["target"] == {"files": {target_gguf.name: _sha256(target_gguf)}}
    assert "| drafter | local `dflash-b16` | - | config.json |" in body


# -- validate --reference-*: the PyTorch reference from repo ids ----------------------------------------

def test_reference_repo_errors_come_before_any_server(hub, fixtures, converted, target_gguf, tmp_path):
    hub.add_folder("Qwen/tiny-target", fixtures / "target-hf")
    proc = dflash_gguf("validate", "-t", target_gguf, "-d", converted["dflash2-b8"], "--reference-draft",
                       "z-lab/missing", "--reference-target", "Qwen/tiny-target", env=hub_env(hub, tmp_path))
    assert_refused(proc, "no repository z-lab/missing")


@pytest.mark.integration
def test_validate_reference_from_repo_ids(hub, fixtures, converted, target_gguf, llama_bin, tmp_path):
    sha = hub.add_folder("z-lab/tiny-dflash2", fixtures / "dflash2-b8")
    hub.add_folder("Qwen/tiny-target", fixtures / "target-hf")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The capital of France is\nQuestion: 2 + 2 =\n")
    out = tmp_path / "report.json"
    proc = dflash_gguf("validate", "-t", target_gguf, "-d", converted["dflash2-b8"], "--prompts", prompts, "-n", "8",
                       "--backend", "cpu", "--reference-draft", f"z-lab/tiny-dflash2@{sha}",
                       "--reference-target", "Qwen/tiny-target", "--report", out, env=hub_env(hub, tmp_path))
    assert proc.returncode == 0, proc.stderr
    ref = json.loads(out.read_text())["reference"]
    assert len(ref["prompts"]) == 2 and all(p["tokens"] == 8 for p in ref["prompts"])
    assert sha in ref["draft"]
    # the reference needs the target's weights, so they came down with its config and tokenizer
    assert _fetched(hub, "Qwen/tiny-target") == TARGET_FOLDER_FILES | {"model.safetensors"}



@pytest.mark.integration
def test_a_command_that_runs_the_target_fetches_it_from_the_hub(hub, fixtures, converted, target_gguf, llama_bin,
                                                                tmp_path):
    """--target means the same in every command: generate takes owner/name:QUANT as convert does, and runs
    the whole file, fetched into the Hugging Face cache."""
    _serve(hub, fixtures, target_gguf)
    proc = dflash_gguf("generate", "-t", "org/tiny-target-GGUF:F16", "-d", converted["dflash-b16"], "-n", "4",
                       "--backend", "cpu", "--json", "The capital of France is", env=hub_env(hub, tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["results"][0]["n_predicted"] == 4
    assert hub.bytes_sent("/_lfs/" + Blob(target_gguf.read_bytes()).sha256) == target_gguf.stat().st_size


def test_a_target_named_on_the_hub_must_be_a_gguf_where_it_runs(hub, fixtures, converted, target_gguf, tmp_path):
    _serve(hub, fixtures, target_gguf)
    proc = dflash_gguf("serve", "-t", "org/tiny-target-GGUF", "-d", converted["dflash-b16"], env=hub_env(hub, tmp_path))
    assert_refused(proc, "org/tiny-target-GGUF: names a repository", "owner/name[@revision]:QUANT")
    proc = dflash_gguf("validate", "-t", "org/missing-GGUF:Q4_K_M", "-d", converted["dflash-b16"],
                       env=hub_env(hub, tmp_path))
    assert_refused(proc, "org/missing-GGUF")

# -- part 4: release --push skips a release the repository holds ----------------------------------------

def test_push_commits_once_and_skips_what_the_repo_holds(hub, fixtures, target_gguf, tmp_path):
    shas = _serve(hub, fixtures, target_gguf)
    env = hub_env(hub, tmp_path, token=TOKEN)
    dest = "me/tiny-dflash-GGUF"

    def push(*extra: str):
        return dflash_gguf("release", "z-lab/tiny-dflash", "-t", "org/tiny-target-GGUF:F16", "--types", "F16",
                           "--target-license", "apache-2.0", "--push", dest, *extra, env=env)

    proc = push()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"committed 3 files to {dest}: "), proc.stdout
    (commit,) = hub.commits[dest]
    assert sorted(line["value"]["path"] for line in commit[1:]) == [
        "LICENSE", "README.md", "dflash-tiny-target-F16.gguf"]
    assert shas["z-lab/tiny-dflash"][:12] in commit[0]["value"]["summary"]

    # the same sources, types and version: nothing is fetched, built or committed
    calls = len(hub.calls)
    proc = push()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"nothing to do: {dest} already holds this release"), proc.stdout
    assert len(hub.commits[dest]) == 1
    new = hub.calls[calls:]
    assert {c["path"] for c in new} <= {"/api/models/z-lab/tiny-dflash/revision/main",
                                        "/api/models/org/tiny-target-GGUF/revision/main",
                                        f"/{dest}/resolve/main/README.md"}, [c["path"] for c in new]

    # --force redoes it; a new type, or a drafter that moved on, makes a new release by itself
    assert push("--force").returncode == 0 and len(hub.commits[dest]) == 2
    proc = dflash_gguf("release", "z-lab/tiny-dflash", "-t", "org/tiny-target-GGUF:F16", "--types", "F16,F32",
                       "--target-license", "apache-2.0", "--push", dest, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["skipped"] is False and len(hub.commits[dest]) == 3
    moved = hub.add_commit("z-lab/tiny-dflash", {"README.md": "---\nlicense: mit\n---\n# v2\n"}, replace=False)
    proc = push()
    assert proc.returncode == 0 and len(hub.commits[dest]) == 4, proc.stderr
    card = hub.store[dest].commits[hub.store[dest].refs["main"]]["README.md"].data.decode()
    front, _ = split_front_matter(card)
    assert front["dflash_gguf"]["drafter"]["revision"] == moved
    assert push().stdout.startswith("nothing to do") and len(hub.commits[dest]) == 4

    # a card written by another version of the tool is not this release
    hub.add_commit(dest, {"README.md": card.replace(f"version: {__version__}", "version: 0.0.0")}, replace=False)
    assert push().returncode == 0 and len(hub.commits[dest]) == 5


def test_push_needs_a_token_before_any_work(hub, fixtures, target_gguf, tmp_path):
    _serve(hub, fixtures, target_gguf)
    proc = dflash_gguf("release", "z-lab/tiny-dflash", "-t", "org/tiny-target-GGUF:F16", "--types", "F16",
                       "--push", "me/x", env=hub_env(hub, tmp_path))
    assert assert_refused(proc).startswith("error: no Hugging Face token")
    assert hub.calls == []


def test_an_unreachable_hub_is_one_line(fixtures, tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp_path / "hf"), NO_PROXY="127.0.0.1")
    out = tmp_path / "x.gguf"
    for drafter, target in (("z-lab/tiny-dflash", fixtures / "target-hf"), (fixtures / "dflash-b16", "org/t:Q4_K_M")):
        proc = dflash_gguf("convert", drafter, "-t", target, "-o", out, env=env)
        assert_refused(proc, "cannot reach", f"127.0.0.1:{port}", out=out)


def test_default_output_is_named_after_the_repo(hub, fixtures, target_gguf, tmp_path):
    hub.add_folder("z-lab/tiny-dflash", fixtures / "dflash-b16")
    work = tmp_path / "work"
    work.mkdir()
    proc = _convert(hub, tmp_path, "z-lab/tiny-dflash", "-t", target_gguf, "--outtype", "f16", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in work.iterdir()] == ["tiny-dflash-F16.gguf"]
