"""Never lose or leak (issue 22): the attacks of the adversarial pass, each reproduced through the real
command line, against the one confined reader (dflash_gguf/confined_reader.py) and the one secret filter
(dflash_gguf/secrets.py).

- an index naming a shard outside the checkpoint is refused, and `-o <that file> --force` never
  overwrites it;
- a target folder's tokenizer files linked out of it (to a file holding a token, to
  /proc/self/environ) are refused: nothing of them reaches the GGUF;
- a file swapped for a link after `publish` / `release` listed the folder: what was checked is what
  is sent or copied;
- an output is refused when it is any file the command read, wherever it was found (a Hub cache blob);
- a token (HF_TOKEN, the stored login, an Authorization header a server echoes) never reaches stderr,
  a log or a report.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path

import pytest

from dflash_gguf.confined_reader import find_in, open_in, safe_name
from dflash_gguf.errors import InputError, OutsideFolderError
from tests.conftest import dflash_gguf
from tests.local_hub import hub_env
from tests.base.test_corpus import check

TOKEN = "hf_ConfinedReaderSecretToken0123456789abcd"
FAKE = f"HF_TOKEN={TOKEN}\n"


@pytest.fixture
def ckpt(fixtures: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(fixtures / "dflash-b16", dst)
    return dst


@pytest.fixture
def target_folder(fixtures: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "target-hf"
    shutil.copytree(fixtures / "target-hf", dst, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    return dst


def _everything_written(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink())


# -- the index names files inside the folder, and nothing is overwritten through it ------------------------

def _index_pointing_at(ckpt: Path, shard: str) -> None:
    from dflash_gguf.gguf.safetensors_file import read_header

    names = read_header(open_in(ckpt, "model.safetensors"))
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: shard for n in names}}))


@pytest.mark.parametrize("spelling", ["dotdot", "absolute", "dotdot-inside", "link-out", "backslash"])
def test_an_index_shard_outside_the_folder_is_refused_and_never_overwritten(ckpt, target_gguf, tmp_path, spelling):
    victim = tmp_path / "victim.safetensors"
    shutil.copyfile(ckpt / "model.safetensors", victim)
    shard = {"dotdot": "../victim.safetensors", "absolute": str(victim),
             "dotdot-inside": "sub/../../victim.safetensors", "link-out": "shard.safetensors",
             "backslash": "..\\victim.safetensors"}[spelling]
    if spelling == "link-out":
        (ckpt / "shard.safetensors").symlink_to(victim)
    _index_pointing_at(ckpt, shard)
    (ckpt / "model.safetensors").unlink()
    _, _, stderr = check(["convert", ckpt, "--target", target_gguf, "-o", victim, "--force"], {2},
                         inputs=[ckpt, victim], outputs=[victim])
    assert "model.safetensors.index.json" in stderr or "outside" in stderr, stderr


def test_a_shard_in_a_subfolder_or_linked_inside_is_still_read(ckpt, target_gguf, tmp_path):
    _index_pointing_at(ckpt, "weights/model.safetensors")
    (ckpt / "weights").mkdir()
    os.replace(ckpt / "model.safetensors", ckpt / "weights" / "model.safetensors")
    (ckpt / "model.safetensors").symlink_to(Path("weights/model.safetensors"))  # a link that stays inside
    out = tmp_path / "o.gguf"
    check(["convert", ckpt, "--target", target_gguf, "-o", out], {0}, inputs=[ckpt], outputs=[out])
    assert out.stat().st_size > 0


# -- a target folder's files linked out of it ---------------------------------------------------------------

@pytest.mark.parametrize("name, leads_to", [("chat_template.jinja", "token-file"), ("tokenizer_config.json", "token-file"),
                                            ("tokenizer_config.json", "/proc/self/environ"),
                                            ("chat_template.jinja", "/proc/self/environ"),
                                            ("tokenizer.json", "token-file"), ("config.json", "/proc/self/environ")])
def test_target_files_linked_out_of_the_folder_never_reach_the_gguf(ckpt, target_folder, tmp_path, name, leads_to):
    token_file = tmp_path / "elsewhere" / "secret"
    token_file.parent.mkdir()
    token_file.write_text(FAKE)
    (target_folder / name).unlink(missing_ok=True)
    (target_folder / name).symlink_to(token_file if leads_to == "token-file" else Path(leads_to))
    out = tmp_path / "o.gguf"
    _, stdout, stderr = check(["convert", ckpt, "--target", target_folder, "-o", out], {2},
                              inputs=[ckpt, token_file], outputs=[out], env={"HF_TOKEN": TOKEN})
    assert "outside" in stderr and name in stderr, stderr
    assert TOKEN not in stdout + stderr
    assert not out.exists() and TOKEN.encode() not in _everything_written(tmp_path / "ckpt")


# -- check-then-use: what was checked is what is sent or copied -----------------------------------------------

def test_publish_sends_the_bytes_it_checked_after_a_swap(hub, tmp_path):
    from huggingface_hub import HfApi

    from dflash_gguf.release.publish import commit_files, plan_upload
    from tests.release.test_publish import _folder

    folder = _folder(tmp_path / "rel", "license: mit\n")
    secret = tmp_path / "secret"
    secret.write_text(FAKE)
    uploads, _ = plan_upload(folder)
    # after the listing, the license (and a drafter file) become links to a file outside
    for name in ("LICENSE", "dflash-Tiny-Q8_0.gguf"):
        original = (folder / name).read_bytes()
        (folder / name).unlink()
        (folder / name).symlink_to(secret)
        (tmp_path / f"{name}.orig").write_bytes(original)
    commit_files(uploads, "me/tiny", api=HfApi(endpoint=hub.url, token=TOKEN))
    sent = {ln["value"]["path"]: base64.b64decode(ln["value"]["content"])
            for ln in hub.commits["me/tiny"][0] if ln["key"] == "file"}
    assert sent["LICENSE"] == (tmp_path / "LICENSE.orig").read_bytes()
    assert sent["dflash-Tiny-Q8_0.gguf"] == (tmp_path / "dflash-Tiny-Q8_0.gguf.orig").read_bytes()
    assert not any(TOKEN.encode() in body for body in sent.values())


def test_release_copies_the_license_it_judged(ckpt, tmp_path):
    from dflash_gguf.licenses import License, license_from_folder
    from dflash_gguf.release import license_rules as lic
    from dflash_gguf.release.license_files import plan_license_files, write_license_files

    (ckpt / "README.md").write_text("---\nlicense: mit\n---\n")
    (ckpt / "LICENSE").write_text("MIT License\n")
    drafter = license_from_folder(ckpt)
    terms = lic.effective_terms(drafter, License("mit", "--target-license"), {})
    plan = plan_license_files(terms)
    secret = tmp_path / "secret"
    secret.write_text(FAKE)
    (ckpt / "LICENSE").unlink()
    (ckpt / "LICENSE").symlink_to(secret)  # swapped after it was read and judged
    out = tmp_path / "rel"
    out.mkdir()
    write_license_files(plan, out)
    assert (out / "LICENSE").read_text() == "MIT License\n"


# -- outputs are checked against every file read ----------------------------------------------------------

def test_an_output_never_replaces_a_hub_cache_file_it_read(hub, fixtures, target_gguf, tmp_path):
    hub.add_folder("z-lab/tiny-dflash", fixtures / "dflash-b16")
    hub.add_folder("Qwen/tiny-target", fixtures / "target-hf")
    env = hub_env(hub, tmp_path)
    first = dflash_gguf("convert", "z-lab/tiny-dflash", "--target", "Qwen/tiny-target", "-o", tmp_path / "a.gguf",
                        env=env)
    assert first.returncode == 0, first.stderr
    blobs = tmp_path / "hf-home" / "hub" / "models--Qwen--tiny-target" / "blobs"
    victim = next(p for p in blobs.iterdir() if b"vocab_size" in p.read_bytes())  # the target's config.json
    before = victim.read_bytes()
    proc = dflash_gguf("convert", "z-lab/tiny-dflash", "--target", "Qwen/tiny-target", "-o", victim, "--force",
                       env=env)
    assert proc.returncode == 2 and "a file this command reads" in proc.stderr, proc.stderr
    assert victim.read_bytes() == before


# -- the confined reader itself -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../../x", "a//b", "./x", "x\n", "x\x1b[2K", "a\\b", "",
                                  7, None])
def test_names_that_leave_a_folder_are_refused(name):
    with pytest.raises(InputError):
        safe_name(name, "index.json", "weight_map shard")


def test_a_link_swapped_in_after_the_check_is_not_followed(tmp_path, monkeypatch):
    folder = tmp_path / "f"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "x").write_text("inside")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text(FAKE)
    import dflash_gguf.confined_reader as confine

    real_region = confine._region

    def swap_then_check(real, where):  # the race: the check passes, then a component becomes a link
        region = real_region(real, where)
        shutil.rmtree(folder / "sub")
        (folder / "sub").symlink_to(tmp_path / "out", target_is_directory=True)
        return region

    monkeypatch.setattr(confine, "_region", swap_then_check)
    with pytest.raises(OutsideFolderError, match="became a link"):
        find_in(folder, "sub/x")


def test_hub_snapshot_links_to_the_repo_blobs_are_read(tmp_path):
    repo = tmp_path / "models--org--name"
    snap = repo / "snapshots" / ("a" * 40)
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "blobs" / "123").write_text("MIT License")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("x")
    (snap / "LICENSE").symlink_to(Path("../../blobs/123"))
    (snap / "REFS").symlink_to(Path("../../refs/main"))  # the repo's folder, but not its blobs
    assert open_in(snap, "LICENSE").text() == "MIT License"
    with pytest.raises(OutsideFolderError):
        open_in(snap, "REFS")


# -- the secret filter ------------------------------------------------------------------------------------

@pytest.mark.parametrize("login", ["env", "stored"])
def test_a_server_echoing_the_authorization_header_never_leaks_the_token(hub, fixtures, target_gguf, tmp_path, login):
    hub.add_folder("z-lab/tiny-dflash", fixtures / "dflash-b16")
    hub.echo_authorization = True
    hub.fail_all = 400
    env = hub_env(hub, tmp_path, token=TOKEN if login == "env" else None)
    if login == "stored":
        (tmp_path / "hf-home").mkdir(exist_ok=True)
        (tmp_path / "hf-home" / "token").write_text(TOKEN)
    report = tmp_path / "o.gguf"
    proc = dflash_gguf("-v", "convert", "z-lab/tiny-dflash", "--target", target_gguf, "-o", report, env=env)
    assert proc.returncode == 2, proc.stderr
    sent = [c["headers"].get("authorization", "") for c in hub.calls]
    assert any(TOKEN in a for a in sent), "the token was never sent: the test would prove nothing"
    assert "***" in proc.stderr, proc.stderr  # the echoed header is there, masked
    assert TOKEN not in proc.stderr + proc.stdout
    assert not report.exists()


def test_scrub_masks_tokens_headers_and_bearer_values(monkeypatch):
    from dflash_gguf.secrets import scrub

    monkeypatch.setenv("HF_TOKEN", "plain-secret-value")
    text = scrub("a plain-secret-value b; Authorization: Bearer abc.def-123 c; 'authorization': 'xyz789' "
                 "d bearer QWERTY123456 e hf_" + "A" * 34)
    for leaked in ("plain-secret-value", "abc.def-123", "xyz789", "QWERTY123456", "hf_AAAA"):
        assert leaked not in text, text


def test_reports_are_scrubbed(tmp_path, monkeypatch):
    from dflash_gguf.outputs import write_text

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    write_text(tmp_path / "r.json", json.dumps({"error": f"server said {TOKEN}"}))
    assert TOKEN not in (tmp_path / "r.json").read_text()


# -- terminal-safe human output; names that are not what they look like ------------------------------------

def test_inspect_escapes_values_from_the_file_and_json_stays_exact(ckpt, target_gguf, tmp_path):
    from gguf import GGUFValueType as T

    from tests.malformed import encode, rebuild_gguf

    good = tmp_path / "dflash-b16.gguf"
    check(["convert", ckpt, "--target", target_gguf, "-o", good], {0}, inputs=[ckpt], outputs=[good])
    fake = "mit\x1b[2K\r  problems        none found"
    bad = rebuild_gguf(good, tmp_path / "dflash-x.gguf",
                       kv=lambda kvs: [(k, v) for k, v in kvs if k != "general.license"]
                       + [("general.license", encode(T.STRING, fake))])
    _, stdout, _ = check(["inspect", bad], {0, 1}, inputs=[bad])
    assert "\x1b" not in stdout and "\r" not in stdout and "\\x1b[2K" in stdout, stdout
    _, report, _ = check(["inspect", "--json", bad], {0, 1}, inputs=[bad])
    assert json.loads(report)["license"] == fake


def test_an_output_name_that_is_not_utf8_is_written_and_shown_escaped(ckpt, target_gguf, tmp_path):
    out = Path(os.fsdecode(bytes(tmp_path) + b"/\xff-out.gguf"))
    proc = dflash_gguf("convert", ckpt, "--target", target_gguf, "-o", out)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "\\udcff" in proc.stdout or "\\xff" in proc.stdout, proc.stdout
    assert out.exists()


@pytest.mark.parametrize("repo", ["me/tiny\n", "me/tiny\nother", "me/ti\x1bny"])
def test_a_repo_id_with_a_control_character_is_refused(tmp_path, repo):
    from tests.release.test_publish import _folder

    folder = _folder(tmp_path / "rel", "license: mit\n")
    _, _, stderr = check(["publish", folder, "--repo", repo, "--dry-run"], {2}, inputs=[folder])
    assert "\x1b" not in stderr and "--repo" in stderr


@pytest.mark.parametrize("front", ["a: &x [1]\nb: *x\n", "size: " + "9" * 5000 + "\n", "date: 2024-13-45\n",
                                   "license: " + "[" * 200 + "]" * 200 + "\n", "x: '" + "a" * (300 << 10) + "'\n"])
def test_card_front_matter_is_parsed_with_limits(front):
    """Billion laughs, integers of thousands of digits, impossible dates, deep nesting, a huge front
    matter: one LicenseError each, before anything is built (and quickly)."""
    import time

    from dflash_gguf.errors import LicenseError
    from dflash_gguf.licenses import split_front_matter

    started = time.monotonic()
    with pytest.raises(LicenseError):
        split_front_matter(f"---\n{front}---\n# card\n", "README.md")
    assert time.monotonic() - started < 2


def test_a_sparse_huge_tokenizer_is_refused_unread(ckpt, target_folder, tmp_path):
    with open(target_folder / "tokenizer.json", "r+b") as fh:
        fh.truncate(6 << 30)  # 6 GiB, sparse: nothing to read, everything to refuse
    out = tmp_path / "o.gguf"
    _, _, stderr = check(["convert", ckpt, "--target", target_folder, "-o", out], {2}, outputs=[out])
    assert "tokenizer.json" in stderr and "MiB" in stderr, stderr


def test_a_token_inside_an_input_never_reaches_the_gguf(ckpt, target_folder, tmp_path):
    """Even inside the folder: a chat template holding the user's token is refused, not copied."""
    config = json.loads((target_folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ messages }} " + TOKEN
    (target_folder / "tokenizer_config.json").write_text(json.dumps(config))
    out = tmp_path / "o.gguf"
    _, stdout, stderr = check(["convert", ckpt, "--target", target_folder, "-o", out], {2},
                              inputs=[target_folder], outputs=[out], env={"HF_TOKEN": TOKEN})
    assert "would carry the Hugging Face token" in stderr and TOKEN not in stdout + stderr, stderr


@pytest.mark.parametrize("spelling", ["as-is", "normalised", "upper-case"])
def test_a_token_in_the_card_license_is_refused_in_any_spelling(ckpt, target_gguf, tmp_path, spelling):
    """The license is normalised (lower case, '_' -> '-') before it is written: the token is found in
    the card's value as it is, and in any case and punctuation."""
    value = {"as-is": TOKEN, "normalised": TOKEN.lower().replace("_", "-"), "upper-case": TOKEN.upper()}[spelling]
    (ckpt / "README.md").write_text(f"---\nlicense: {value}\n---\n")
    out = tmp_path / "o.gguf"
    _, stdout, stderr = check(["convert", ckpt, "--target", target_gguf, "-o", out], {2},
                              inputs=[ckpt], outputs=[out], env={"HF_TOKEN": TOKEN})
    assert "README.md: field 'license': would carry the Hugging Face token" in stderr, stderr
    assert not out.exists()
    assert TOKEN.lower().replace("_", "-") not in (stdout + stderr).lower().replace("_", "-")


def test_the_secret_filter_finds_a_token_in_any_case_and_punctuation(monkeypatch, tmp_path):
    from dflash_gguf import secrets
    from dflash_gguf.confined_reader import open_in
    from dflash_gguf.errors import OutputError

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    folded = TOKEN.lower().replace("_", "-")
    assert secrets.scrub(f"a {folded} b {TOKEN.upper()} c") == "a *** b *** c"
    with pytest.raises(OutputError):
        secrets.refuse_secrets(["mit", folded], "x.gguf")
    monkeypatch.setattr(secrets, "_CHUNK", 7)  # the token across chunks
    (tmp_path / "f").write_bytes(b"\0" * 5 + folded.upper().encode() + b"\0")
    with pytest.raises(OutputError):
        secrets.refuse_secrets_in_file(open_in(tmp_path, "f"), "f")
    (tmp_path / "g").write_bytes(b"\0" * 5 + TOKEN[:-1].encode() + b"\0")
    secrets.refuse_secrets_in_file(open_in(tmp_path, "g"), "g")


def test_inspect_never_prints_a_token_the_file_holds(ckpt, target_gguf, tmp_path):
    """stdout passes the secret filter too: a GGUF's metadata is shown, the user's token in it is not."""
    from gguf import GGUFValueType as T

    from tests.malformed import encode, rebuild_gguf

    good = tmp_path / "dflash-b16.gguf"
    check(["convert", ckpt, "--target", target_gguf, "-o", good], {0}, inputs=[ckpt], outputs=[good])
    bad = rebuild_gguf(good, tmp_path / "dflash-x.gguf",
                       kv=lambda kvs: [(k, v) for k, v in kvs if k != "general.license"]
                       + [("general.license", encode(T.STRING, f"mit {TOKEN}"))])
    for json_flag in ([], ["--json"]):
        _, stdout, _ = check(["inspect", *json_flag, bad], {0, 1}, inputs=[bad], env={"HF_TOKEN": TOKEN})
        assert "mit ***" in stdout and TOKEN not in stdout, stdout


@pytest.mark.parametrize("command", ["convert", "release"])
def test_success_output_shows_names_escaped(ckpt, target_gguf, tmp_path, command):
    """The "wrote ..." line names the output as error lines do: an OSC title or BEL in a name is
    shown, never sent to the terminal."""
    name = "o\x1b]0;pwn\x07\x1b[2K\rfake"
    if command == "convert":
        out = tmp_path / f"{name}.gguf"
        args = ["convert", ckpt, "--target", target_gguf, "-o", out]
    else:
        (ckpt / "README.md").write_text("---\nlicense: mit\n---\n")
        out = tmp_path / name
        args = ["release", ckpt, "--target", target_gguf, "--types", "F16", "-o", out, "--skip-validate",
                "--target-license", "mit"]
    _, stdout, stderr = check(args, {0}, inputs=[ckpt], outputs=[out])
    assert "wrote " in stdout and "\\x1b]0;pwn\\x07" in stdout, stdout
    assert not any(c in stdout + stderr for c in "\x1b\x07\r"), stdout + stderr
