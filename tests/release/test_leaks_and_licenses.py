"""Nothing outside a folder goes into a release or an upload, and no spelling of a license gets
around its terms (issue 14, classes 2 and 3). Every case runs the real command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_gguf.confined_reader import is_inside
from dflash_gguf.gguf.license import license_from_gguf
from dflash_gguf.gguf.reader import GGUFFile
from dflash_gguf.licenses import Kind, kind_of, license_ids
from tests.conftest import dflash_gguf
from tests.refusal import assert_refused
from tests.release.test_publish import _env, _folder, _publish, tiny_gguf  # the hub fixture is conftest.py's

SECRET = "SECRET-OUTSIDE-BYTES-0123456789"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    secret = tmp_path / "elsewhere" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text(SECRET + "\n")
    return secret


def _release(ckpt: Path, target: Path, out: Path, *extra: str):
    return dflash_gguf("release", ckpt, "--target", target, "--types", "F16", "-o", out, "--skip-validate",
                       "--target-license", "mit", *extra)


def _nothing_written(out: Path) -> None:
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}*")), "a temporary folder was left behind"


# -- class 2: links out of a folder ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["LICENSE", "NOTICE", "README.md"])
def test_release_refuses_a_license_file_linked_out_of_the_checkpoint(drafter_copy, target_gguf, tmp_path,
                                                                     outside, name):
    ckpt = drafter_copy("dflash-b16")
    if name != "README.md":
        (ckpt / "README.md").write_text("---\nlicense: mit\n---\n")
    (ckpt / name).symlink_to(outside)
    out = tmp_path / "rel"
    assert_refused(_release(ckpt, target_gguf, out), name, "outside")
    _nothing_written(out)


def test_release_refuses_a_license_link_file_leading_out(drafter_copy, target_gguf, tmp_path, outside):
    ckpt = drafter_copy("dflash-b16")
    (ckpt / "README.md").write_text("---\nlicense: other\nlicense_name: acme\nlicense_link: terms/ACME.md\n---\n")
    (ckpt / "terms").symlink_to(outside.parent, target_is_directory=True)
    (outside.parent / "ACME.md").write_text(SECRET)
    out = tmp_path / "rel"
    assert_refused(_release(ckpt, target_gguf, out), "ACME.md", "outside")
    _nothing_written(out)


def test_links_inside_a_hub_cache_repo_are_the_folder_s_own(tmp_path):
    repo = tmp_path / "models--org--name"
    snap = repo / "snapshots" / "abc"
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "blobs" / "123").write_text("MIT License")
    (snap / "LICENSE").symlink_to(Path("../../blobs/123"))
    assert is_inside(snap / "LICENSE", snap)
    (snap / "OTHER").symlink_to(tmp_path)
    assert not is_inside(snap / "OTHER", snap)


def test_publish_refuses_a_listed_file_linked_out_of_the_folder(hub, tmp_path, outside):  # noqa: F811
    folder = _folder(tmp_path / "rel", extra={"NOTICE": "x"})
    (folder / "NOTICE").unlink()
    (folder / "NOTICE").symlink_to(outside)
    assert_refused(_publish(folder, "--repo", "me/tiny", env=_env(hub, tmp_path)), "NOTICE", "outside")
    assert hub.calls == []
    gguf = folder / "dflash-Tiny-F16.gguf"
    moved = tiny_gguf(outside.parent / "real.gguf", 2)
    gguf.unlink()
    gguf.symlink_to(moved)
    (folder / "NOTICE").unlink()
    (folder / "NOTICE").write_text("notice\n")
    assert_refused(_publish(folder, "--repo", "me/tiny", env=_env(hub, tmp_path)), "dflash-Tiny-F16.gguf", "outside")
    assert hub.calls == []


def test_publish_refuses_files_its_card_does_not_list(hub, tmp_path):  # noqa: F811
    folder = _folder(tmp_path / "rel")
    (folder / "notes.txt").write_text("private notes")
    (folder / "scratch").mkdir()
    assert_refused(_publish(folder, "--repo", "me/tiny", env=_env(hub, tmp_path)), "notes.txt", "scratch/",
             "not part of the release")
    assert hub.calls == []


def test_publish_names_the_hidden_entries_it_leaves_out(hub, tmp_path):  # noqa: F811
    folder = _folder(tmp_path / "rel")
    proc = _publish(folder, "--repo", "me/tiny", "--dry-run", env=_env(hub, tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "left out (hidden): .cache" in proc.stdout


def test_publish_refuses_a_card_listing_a_missing_file(hub, tmp_path):  # noqa: F811
    folder = _folder(tmp_path / "rel")
    (folder / "LICENSE").unlink()
    assert_refused(_publish(folder, "--repo", "me/tiny", env=_env(hub, tmp_path)), "lists LICENSE")


# -- class 3: one parser, the strictest terms win ------------------------------------------------------

ND_SPELLINGS = {
    "yaml-list": "license:\n- cc-by-nc-nd-4.0\n",
    "flow-list": "license: [mit, cc-by-nd-4.0]\n",
    "trailing-comment": "license: cc-by-nc-nd-4.0 # no derivatives, please\n",
    "quoted-upper": "license: 'CC-BY-NC-ND-4.0'\n",
    "two-in-a-string": "license: mit AND cc-by-nc-nd-4.0\n",
    "other-named-nd": "license: other\nlicense_name: cc-by-nc-nd-4.0\nlicense_link: https://example.com/terms\n",
}


@pytest.mark.parametrize("spelling", sorted(ND_SPELLINGS))
def test_a_no_derivatives_card_stays_no_derivatives_through_convert_and_quantize(drafter_copy, target_gguf,
                                                                                 tmp_path, spelling):
    ckpt = drafter_copy("dflash-b16")
    (ckpt / "README.md").write_text(f"---\n{ND_SPELLINGS[spelling]}---\n# card\n")
    out = tmp_path / "d.gguf"
    proc = dflash_gguf("convert", ckpt, "--target", target_gguf, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert license_from_gguf(out).kind is Kind.NO_DERIVATIVES
    assert_refused(dflash_gguf("quantize", out, tmp_path / "q.gguf", "--type", "Q8_0"), "NoDerivatives")
    assert not (tmp_path / "q.gguf").exists()
    assert_refused(_release(ckpt, target_gguf, tmp_path / "rel"), "NoDerivatives")
    assert_refused(dflash_gguf("convert", ckpt, "--target", target_gguf, "-o", tmp_path / "e.gguf", "--license", "mit"),
             "--license mit")


def test_a_license_file_stating_no_derivatives_beats_a_permissive_card(drafter_copy, target_gguf, tmp_path):
    ckpt = drafter_copy("dflash-b16")
    (ckpt / "README.md").write_text("---\nlicense: mit\n---\n")
    (ckpt / "LICENSE").write_text("Attribution-NonCommercial-NoDerivatives 4.0 International\n...")
    assert_refused(_release(ckpt, target_gguf, tmp_path / "rel"), "LICENSE", "NoDerivatives")
    out = tmp_path / "d.gguf"
    assert dflash_gguf("convert", ckpt, "--target", target_gguf, "-o", out).returncode == 0
    with GGUFFile(out) as f:
        assert kind_of(f.get("general.license")) is Kind.NO_DERIVATIVES


@pytest.mark.parametrize("gguf_license, needle", [
    ("cc-by-nc-nd-4.0", "NoDerivatives"),
    ("mit # fine\n", None),
    ("mit, cc-by-nd-4.0", "NoDerivatives"),
    ("cc-by-nc-4.0", "stricter than the card"),
])
def test_publish_takes_the_strictest_of_card_and_gguf(hub, tmp_path, gguf_license, needle):  # noqa: F811
    folder = _folder(tmp_path / "rel", "license: mit\n", gguf_license=gguf_license)
    proc = _publish(folder, "--repo", "me/tiny", "--dry-run", env=_env(hub, tmp_path))
    if needle is None:
        assert proc.returncode == 0, proc.stderr
    else:
        assert_refused(proc, needle, "dflash-Tiny-")


def test_publish_refuses_a_no_derivatives_license_text(hub, tmp_path):  # noqa: F811
    folder = _folder(tmp_path / "rel", "license: mit\n")
    (folder / "LICENSE").write_text("See https://creativecommons.org/licenses/by-nd/4.0/legalcode\n")
    assert_refused(_publish(folder, "--repo", "me/tiny", "--dry-run", env=_env(hub, tmp_path)), "NoDerivatives")


@pytest.mark.parametrize("value, ids", [
    ("Apache-2.0", ["apache-2.0"]),
    ("apache license 2.0", ["apache-2.0"]),
    (["cc-by-nc-4.0"], ["cc-by-nc-4.0"]),
    ("llama3.1 # see NOTICE", ["llama3.1"]),
    ("mit or apache-2.0", ["mit", "apache-2.0"]),
    ("cc-by-nc-4.0-and-llama3.1", ["cc-by-nc-4.0", "llama3.1"]),
    ("", []),
    (None, []),
])
def test_one_parser_for_license_values(value, ids):
    assert license_ids(value) == ids
