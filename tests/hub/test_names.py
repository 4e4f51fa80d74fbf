"""Names held to the Hub's rules (repo ids, revisions, the commit a release records), prompts files
split at `\\n` only, and error lines of bounded length."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_gguf.hub.resolve import HubRef, parse_ref
from dflash_gguf.errors import ReleaseError
from dflash_gguf.hub.names import is_repo_id, is_revision
from dflash_gguf.release.card import provenance_front_matter
from dflash_gguf.runner.prompts import ChatPrompt, read_prompts
from tests.conftest import dflash_gguf
from tests.local_hub import hub_env

GOOD_IDS = ["z-lab/Qwen3-8B-DFlash-b16", "ggml-org/gpt-oss-20b-GGUF", "a/b", "A_1/x.y_z-2"]
BAD_IDS = [
    "z-lab/tiny-dfl\u0435sh",   # Cyrillic е
    "org/model\u00b2",          # superscript two: str.isdigit() says yes
    "org/model\u0663",          # Arabic-Indic three: matched by \w and \d
    "org--x/name", "org/na--me", "org/na..me", "-org/name", "org/name-", ".org/name", "org/name.",
    "org/name.git", "org/na me", "org/", "/name", "org/name/extra", "o" * 97 + "/name", "org/name\n",
]


@pytest.mark.parametrize("repo", GOOD_IDS)
def test_hub_repo_ids_are_accepted(repo: str):
    assert is_repo_id(repo) and parse_ref(repo) == HubRef(repo)


@pytest.mark.parametrize("repo", BAD_IDS)
def test_what_the_hub_refuses_is_no_repo_id(repo: str):
    assert not is_repo_id(repo) and parse_ref(repo) is None


@pytest.mark.parametrize("rev, ok", [
    ("main", True), ("v1.0", True), ("refs/pr/12", True), ("a" * 40, True), ("release_2", True),
    (".", False), ("..", False), ("a..b", False), ("-main", False), (".hidden", False), ("main.", False),
    ("main.lock", False), ("ma\u0456n", False), ("refs/pr/x", False), ("refs/pr/0", False), ("", False),
])
def test_revisions(rev: str, ok: bool):
    assert is_revision(rev) is ok
    assert (parse_ref(f"z-lab/tiny@{rev}") is not None) is ok


def test_a_revision_the_hub_refuses_is_never_asked_for(hub, fixtures, target_gguf, tmp_path: Path):
    """`@..` was normalised away by the URL and read main."""
    hub.add_folder("z-lab/tiny", fixtures / "dflash-b16")
    env = hub_env(hub, tmp_path)
    for ref in ("z-lab/tiny@..", "z-lab/tiny@.", "z-lab/tin\u0443"):
        proc = dflash_gguf("convert", ref, "--target", target_gguf, "-o", tmp_path / "o.gguf", env=env)
        assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
        assert "not a Hub repo id" in proc.stderr
    assert hub.calls == [] and not (tmp_path / "o.gguf").exists()


def test_publish_refuses_a_repo_id_the_hub_would_refuse(tmp_path: Path):
    from tests.release.test_publish import _folder

    folder = _folder(tmp_path / "rel")
    for repo in ("me/tin\u0443", "me/a--b", "me/x\u00b2"):
        proc = dflash_gguf("publish", folder, "--repo", repo, "--dry-run")
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--repo" in proc.stderr, proc.stderr
        assert "ASCII letters" in proc.stderr


def test_release_refuses_a_base_model_the_hub_would_refuse(drafter_copy, target_gguf, tmp_path: Path):
    drafter = drafter_copy("dflash-b16")
    (drafter / "README.md").write_text("---\nlicense: mit\n---\n")
    proc = dflash_gguf("release", drafter, "--target", target_gguf, "--types", "F16", "-o", tmp_path / "rel",
                       "--target-license", "mit", "--skip-validate", "--base-model", "z-lab/tin\u0443")
    assert proc.returncode == 2 and "--base-model" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "rel").exists()


@pytest.mark.parametrize("sha", ["../../etc", "a" * 39, "A" * 40, "a" * 40 + "\n", "hf_" + "x" * 37, None])
def test_a_release_never_records_a_source_revision_that_is_not_a_commit(sha):
    sources = {"drafter": {"repo": "z-lab/tiny", "revision": sha, "files": {}}}
    with pytest.raises(ReleaseError, match="drafter's revision.*not a commit id"):
        provenance_front_matter(sources, ["F16"])
    good = {"drafter": {"repo": "z-lab/tiny", "revision": "0123456789abcdef0123456789abcdef01234567", "files": {}}}
    assert provenance_front_matter(good, ["F16"])["drafter"]["revision"] == good["drafter"]["revision"]


# -- prompts files --------------------------------------------------------------------------------------------

def test_jsonl_strings_may_hold_any_line_separator_but_newline(tmp_path: Path):
    texts = ["one\u2028two", "three\u0085four", "five\x0csix\x1cseven", "eight\u2029nine"]
    path = tmp_path / "p.jsonl"
    path.write_text("\r\n".join(json.dumps({"prompt": t}, ensure_ascii=False) for t in texts[:2])
                    + "\n" + json.dumps({"messages": [{"role": "user", "content": texts[2]}]}, ensure_ascii=False)
                    + "\n" + json.dumps({"prompt": texts[3]}, ensure_ascii=False) + "\n")
    assert "\u2028" in path.read_text(encoding="utf-8")  # written as it is, not escaped
    prompts = read_prompts(path)
    assert prompts[:2] + prompts[3:] == [texts[0], texts[1], texts[3]]
    assert isinstance(prompts[2], ChatPrompt) and str(prompts[2]) == texts[2]


def test_a_plain_prompts_file_is_split_at_newlines_only(tmp_path: Path):
    path = tmp_path / "p.txt"
    path.write_text("first\u2028still first\r\nsecond\n\nthird\x0bstill third\n", encoding="utf-8")
    assert read_prompts(path) == ["first\u2028still first", "second", "third\x0bstill third"]


# -- error lines ----------------------------------------------------------------------------------------------

def test_an_error_line_is_capped_and_says_how_much_was_cut(tmp_path: Path):
    (tmp_path / "d").mkdir()
    (tmp_path / "t.gguf").write_bytes(b"")
    value = "q" * 100_000
    proc = dflash_gguf("convert", tmp_path / "d", "--target", tmp_path / "t.gguf", "-o", tmp_path / "o.gguf",
                       "--outtype", value)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1
    assert len(proc.stderr) < 2200 and "more characters cut" in proc.stderr, len(proc.stderr)


def test_a_token_across_the_cut_is_still_masked(monkeypatch):
    from dflash_gguf.cli import ERROR_LINE_LIMIT, _one_line

    token = "plain-secret-value-0123456789"
    monkeypatch.setenv("HF_TOKEN", token)
    line = _one_line("x" * (ERROR_LINE_LIMIT - 10) + token + "y" * 100)
    assert token[:10] not in line and "***" in line
