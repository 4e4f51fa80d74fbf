"""`dflash-gguf release`: the folder, its card and license files, and the refusals that write nothing."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as QT

from dflash_gguf.gguf.reader import GGUFFile
from dflash_gguf.errors import DflashError
from dflash_gguf.licenses import split_front_matter
from dflash_gguf.owned_folder import MANIFEST, built_beside
from dflash_gguf.release import license_rules as lic
from dflash_gguf.release.release import ReleaseSettings, release
from dflash_gguf.validation.validate import ValidationReport
from tests.conftest import dflash_gguf
from tests.refusal import assert_refused
from tests.validation_reports import validation_report

LLAMA31_NOTICE = ("Llama 3.1 is licensed under the Llama 3.1 Community License, Copyright © Meta Platforms, Inc. "
                  "All Rights Reserved.\n")


def _card(folder: Path, front: str) -> None:
    (folder / "README.md").write_text(f"---\n{front}---\n# a model card\n", encoding="utf-8")


def _front(readme: Path) -> tuple[dict, str]:
    return split_front_matter(readme.read_text(encoding="utf-8"))


def _rows(body: str) -> dict[str, list[str]]:
    """The variants table of a card: file name -> its cells."""
    rows = {}
    for line in body.splitlines():
        m = re.match(r"\| \[(dflash-[^\]]+)\]", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in line.strip("|").split("|")]
    return rows


def _earlier_release(out: Path, files: dict[str, str]) -> None:
    """A folder as an earlier release left it (with the manifest of what it wrote)."""
    with built_beside(out, force=False, command="release") as folder:
        for name, text in files.items():
            (folder / name).write_text(text)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def apache_drafter(drafter_copy):
    folder = drafter_copy("dflash2-b8")
    _card(folder, "license: apache-2.0\nbase_model: Qwen/Qwen3-8B\nextra_gated_prompt: Tell us who you are\n"
                  "extra_gated_fields:\n  Company: text\n")
    (folder / "LICENSE").write_text("Apache License 2.0 (text)\n")
    return folder


@pytest.fixture
def llama_target(fixtures: Path, tmp_path: Path) -> Path:
    """The tiny target's HF folder with a Llama 3.1 card (gated, as meta-llama's repos are)."""
    folder = tmp_path / "target-llama"
    shutil.copytree(fixtures / "target-hf", folder, ignore=shutil.ignore_patterns("*.safetensors"))
    _card(folder, "license: llama3.1\nextra_gated_prompt: LLAMA 3.1 COMMUNITY LICENSE AGREEMENT\n"
                  "extra_gated_button_content: Submit\n")
    (folder / "LICENSE").write_text("LLAMA 3.1 COMMUNITY LICENSE AGREEMENT (text)\n")
    (folder / "USE_POLICY.md").write_text("Llama 3.1 Acceptable Use Policy (text)\n")
    return folder


# -- the full release ----------------------------------------------------------------------------

@pytest.mark.integration
def test_release_folder_card_and_variants(apache_drafter, target_gguf, llama_bin, tmp_path):
    out = tmp_path / "rel"
    proc = dflash_gguf("release", apache_drafter, "--target", target_gguf, "--types", "F16,Q8_0,Q4_K_M",
                       "-o", out, "--target-license", "apache-2.0", "--name", "Tiny-Qwen3",
                       "--base-model", "z-lab/Tiny-DFlash2", "--skip-validate", "--llama-bin", llama_bin, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    files = ["dflash-Tiny-Qwen3-F16.gguf", "dflash-Tiny-Qwen3-Q8_0.gguf", "dflash-Tiny-Qwen3-Q4_K_M.gguf"]
    assert sorted(p.name for p in out.iterdir()) == sorted(files + ["LICENSE", "README.md", MANIFEST])
    assert report["files"] == sorted(files + ["LICENSE", "README.md"])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary folder left

    meta, body = _front(out / "README.md")
    provenance = meta.pop("dflash_gguf")  # what it was made from (tests/hub/test_hub.py checks it in full)
    assert provenance["types"] == ["F16", "Q8_0", "Q4_K_M"]
    assert provenance["target"] == {"files": {target_gguf.name: _sha256(target_gguf)}}
    assert meta == {
        "license": "apache-2.0", "base_model": "z-lab/Tiny-DFlash2", "base_model_relation": "quantized",
        "tags": ["gguf", "llama.cpp", "dflash", "speculative-decoding"], "pipeline_tag": "text-generation",
        "extra_gated_prompt": "Tell us who you are", "extra_gated_fields": {"Company": "text"},
    }
    rows = _rows(body)
    assert list(rows) == files
    for name in files:
        path = out / name
        cells = rows[name]
        assert cells[1] == name.split("-")[-1].removesuffix(".gguf")
        assert f"`{_sha256(path)}`" == cells[4]
        assert cells[5] == cells[6] == "not validated"
        with GGUFFile(path) as f:
            assert f.get("general.license") == "apache-2.0"
            assert f.get("general.architecture") == "dflash"
    assert rows["dflash-Tiny-Qwen3-F16.gguf"][2] == "-" and rows["dflash-Tiny-Qwen3-Q8_0.gguf"][2] == "plain"
    assert ("llama-server -m Tiny-Qwen3.gguf -md dflash-Tiny-Qwen3-Q8_0.gguf --spec-type draft-dflash "
            "--spec-draft-n-max 7") in body
    assert "DFlash 2" in body and "[LICENSE](./LICENSE)" in body
    assert (out / "LICENSE").read_text() == "Apache License 2.0 (text)\n"
    with GGUFFile(out / "dflash-Tiny-Qwen3-Q4_K_M.gguf") as f:
        assert f.tensors["fc.weight"].type != QT.F16  # the default recipe, plain: fc quantized like the rest
    by_file = {v["file"]: v for v in report["variants"]}
    assert by_file["dflash-Tiny-Qwen3-Q8_0.gguf"]["sha256"] == _sha256(out / "dflash-Tiny-Qwen3-Q8_0.gguf")
    assert by_file["dflash-Tiny-Qwen3-Q4_K_M.gguf"]["off_type"]  # rows of 64 made llama-quantize fall back


def test_llama_target_brings_notice_built_with_and_its_gating(drafter_copy, llama_target, tmp_path):
    drafter = drafter_copy("dflash-b16")
    _card(drafter, "license: mit\n")
    out = tmp_path / "rel"
    proc = dflash_gguf("release", drafter, "--target", llama_target, "--types", "F16", "-o", out,
                       "--name", "Llama-3.1-Tiny", "--base-model", "z-lab/Tiny-DFlash", "--skip-validate")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        MANIFEST, "LICENSE", "NOTICE", "README.md", "USE_POLICY.md", "dflash-Llama-3.1-Tiny-F16.gguf"]
    assert (out / "NOTICE").read_text(encoding="utf-8") == LLAMA31_NOTICE
    assert (out / "LICENSE").read_text().startswith("LLAMA 3.1 COMMUNITY LICENSE AGREEMENT")
    meta, body = _front(out / "README.md")
    assert meta["license"] == "llama3.1"
    assert meta["extra_gated_prompt"] == "LLAMA 3.1 COMMUNITY LICENSE AGREEMENT"
    assert meta["extra_gated_button_content"] == "Submit"
    assert "**Built with Llama**" in body
    assert "https://www.llama.com/llama3_1/license/" in body
    assert "--spec-draft-n-max 15" in body  # block size 16
    with GGUFFile(out / "dflash-Llama-3.1-Tiny-F16.gguf") as f:
        assert f.get("general.license") == "llama3.1"
    assert lic.publish_problems(out) == []


def test_non_commercial_drafter_is_carried_and_flagged(drafter_copy, target_gguf, tmp_path):
    drafter = drafter_copy("dflash-b16")
    _card(drafter, "license: cc-by-nc-4.0\n")
    out = tmp_path / "rel"
    proc = dflash_gguf("release", drafter, "--target", target_gguf, "--types", "F16", "-o", out,
                       "--target-license", "apache-2.0", "--skip-validate")
    assert proc.returncode == 0, proc.stderr
    meta, body = _front(out / "README.md")
    assert meta["license"] == "cc-by-nc-4.0"
    assert "Non-commercial use only" in body
    # default name: the target's file name without its type suffix
    stem = re.sub(r"-f16$", "", target_gguf.stem)
    assert (out / f"dflash-{stem}-F16.gguf").is_file()


def test_nc_drafter_and_llama_target_combine_as_other(drafter_copy, llama_target, tmp_path):
    drafter = drafter_copy("dflash-b16")
    _card(drafter, "license: cc-by-nc-4.0\n")
    out = tmp_path / "rel"
    proc = dflash_gguf("release", drafter, "--target", llama_target, "--types", "F16", "-o", out,
                       "--skip-validate", "--base-model", "z-lab/x")
    assert proc.returncode == 0, proc.stderr
    meta, _ = _front(out / "README.md")
    assert meta["license"] == "other"
    assert meta["license_name"] == "cc-by-nc-4.0-and-llama3.1" and meta["license_link"] == "LICENSES.md"
    text = (out / "LICENSES.md").read_text()
    assert "cc-by-nc-4.0" in text and "https://www.llama.com/llama3_1/license/" in text
    assert (out / "NOTICE").read_text(encoding="utf-8") == LLAMA31_NOTICE
    assert lic.publish_problems(out) == []


def test_other_license_with_a_relative_link_ships_that_file(drafter_copy, target_gguf, tmp_path):
    drafter = drafter_copy("dflash-b16")
    _card(drafter, "license: other\nlicense_name: acme-model-license\nlicense_link: LICENSE.md\n")
    (drafter / "LICENSE.md").write_text("ACME terms\n")
    out = tmp_path / "rel"
    proc = dflash_gguf("release", drafter, "--target", target_gguf, "--types", "F16", "-o", out,
                       "--target-license", "mit", "--skip-validate")
    assert proc.returncode == 0, proc.stderr
    meta, _ = _front(out / "README.md")
    assert meta["license"] == "other"
    assert (meta["license_name"], meta["license_link"]) == ("acme-model-license", "LICENSE.md")
    assert (out / "LICENSE.md").read_text() == "ACME terms\n"
    with GGUFFile(next(out.glob("*.gguf"))) as f:
        assert (f.get("general.license"), f.get("general.license.name")) == ("other", "acme-model-license")


def test_other_license_link_in_a_subfolder_lands_at_the_root(drafter_copy, target_gguf, tmp_path):
    drafter = drafter_copy("dflash-b16")
    _card(drafter, "license: other\nlicense_name: acme\nlicense_link: docs/TERMS.md\n")
    (drafter / "docs").mkdir()
    (drafter / "docs" / "TERMS.md").write_text("ACME terms\n")
    out = tmp_path / "rel"
    proc = dflash_gguf("release", drafter, "--target", target_gguf, "--types", "F16", "-o", out,
                       "--target-license", "mit", "--skip-validate")
    assert proc.returncode == 0, proc.stderr
    assert _front(out / "README.md")[0]["license_link"] == "TERMS.md"
    assert (out / "TERMS.md").read_text() == "ACME terms\n"
    assert lic.publish_problems(out) == []


def test_other_license_link_outside_the_folder_is_refused(drafter_copy, target_gguf, tmp_path):
    drafter = drafter_copy("dflash-b16")
    _card(drafter, "license: other\nlicense_name: acme\nlicense_link: ../secret.txt\n")
    (tmp_path / "secret.txt").write_text("not a license")
    proc = dflash_gguf("release", drafter, "--target", target_gguf, "--types", "F16", "-o", tmp_path / "rel",
                       "--target-license", "mit", "--skip-validate")
    assert_refused(proc, "points outside the model folder")
    assert not (tmp_path / "rel").exists()


@pytest.mark.parametrize("name, front", [("LICENSE", "license: mit\n"), ("NOTICE", "license: mit\n"),
                                         ("TERMS.md", "license: other\nlicense_name: acme\nlicense_link: TERMS.md\n")])
def test_a_sparse_huge_license_file_is_refused_unread(drafter_copy, target_gguf, tmp_path, name, front):
    """A license file is copied into the release whole: one of 2 GiB (sparse: nothing on disk) is
    refused by its size before anything is written."""
    drafter = drafter_copy("dflash-b16")
    _card(drafter, front)
    with open(drafter / name, "wb") as fh:
        fh.truncate(2 << 30)
    proc = dflash_gguf("release", drafter, "--target", target_gguf, "--types", "F16", "-o", tmp_path / "rel",
                       "--target-license", "mit", "--skip-validate")
    assert_refused(proc, f"{name}: this ", "MiB")
    assert not (tmp_path / "rel").exists()


CARD_VALUES = {  # each refused in one line naming the card and the field, never written to a GGUF or a card
    "license-escape": ('license: "apache\\e[2J\\u202e"\n', "'license'"),
    "license-binary": ("license: !!binary aGVsbG8=\n", "'license'"),
    "license-set": ("license: !!set {mit, apache-2.0}\n", "'license'"),
    "license-date": ("license: 2020-01-01\n", "'license'"),
    "license-huge": (f"license: {'a' * 200_000}\n", "'license'"),
    "gated-prompt-escape": ('license: mit\nextra_gated_prompt: "agree\\e]0;x\\a"\n', "'extra_gated_prompt'"),
    "gated-field-date": ("license: mit\nextra_gated_fields:\n  Born: 2020-01-01\n", "'extra_gated_fields.Born'"),
    "gated-binary": ("license: mit\nextra_gated_heading: !!binary aGVsbG8=\n", "'extra_gated_heading'"),
}


@pytest.mark.parametrize("case", sorted(CARD_VALUES))
def test_card_license_and_gating_values_are_typed(drafter_copy, target_gguf, tmp_path, case):
    from tests.base.test_corpus import check

    front, field = CARD_VALUES[case]
    drafter = drafter_copy("dflash-b16")
    _card(drafter, front)
    out = tmp_path / "rel"
    _, _, stderr = check(["release", drafter, "--target", target_gguf, "--types", "F16", "-o", out,
                          "--target-license", "mit", "--skip-validate"], {2}, inputs=[drafter], outputs=[out])
    assert f"README.md: field {field}" in stderr and "\x1b" not in stderr, stderr
    assert not out.exists()


def test_a_gated_prompt_on_several_lines_is_carried(drafter_copy, target_gguf, tmp_path):
    drafter = drafter_copy("dflash-b16")
    _card(drafter, "license: mit\nextra_gated_prompt: |\n  Line one.\n  Line two.\nextra_gated_eu_disallowed: true\n")
    out = tmp_path / "rel"
    proc = dflash_gguf("release", drafter, "--target", target_gguf, "--types", "F16", "-o", out,
                       "--target-license", "mit", "--skip-validate")
    assert proc.returncode == 0, proc.stderr
    meta, _ = _front(out / "README.md")
    assert meta["extra_gated_prompt"] == "Line one.\nLine two.\n" and meta["extra_gated_eu_disallowed"] is True


# -- validation ----------------------------------------------------------------------------------

def _fake_validator(monkeypatch, report: ValidationReport | None, calls: list) -> None:
    """A stand-in for validation/validate.py's validate(target, draft, prompts, settings): the real one
    runs two llama-servers per variant (its own tests run it); here only what release does with
    its report and which settings it passes are checked."""
    from dflash_gguf.validation import validate as validator

    def validate(target, draft, prompts, settings, progress=None):
        calls.append((Path(target), Path(draft).name, len(prompts), settings))
        return report

    monkeypatch.setattr(validator, "validate", validate)


def _release(draft_dir, target, types, out_dir, **options):
    return release(ReleaseSettings(draft_dir=draft_dir, target=target, types=types, out_dir=out_dir, **options))


def test_validator_report_gives_tau_and_speedup(drafter_copy, target_gguf, tmp_path, monkeypatch):
    calls: list = []
    _fake_validator(monkeypatch, validation_report(mean_acceptance_length=2.5, speedup=1.25), calls)
    drafter = drafter_copy("dflash-b16")
    _card(drafter, "license: mit\n")
    r = _release(drafter, target_gguf, "F16,F32", tmp_path / "rel", target_license_id="mit", name="T")
    assert [c[:2] for c in calls] == [(target_gguf, "dflash-T-F16.gguf"), (target_gguf, "dflash-T-F32.gguf")]
    assert calls[0][2] > 0
    assert _rows(_front(tmp_path / "rel" / "README.md")[1])["dflash-T-F16.gguf"][5:] == ["2.50", "1.25x"]
    assert r.variants[1].validation == {"validated": True, "tau": 2.5, "speedup": 1.25, "speedup_unreliable": None,
                                        "note": "validated"}


def test_a_speedup_the_run_cannot_support_is_not_on_the_card(drafter_copy, target_gguf, tmp_path, monkeypatch):
    why = "3 of the 3 rounds came out above tau 1.96"
    report = validation_report(mean_acceptance_length=1.96, speedup=None,
                               speed={"speedup": None, "speedup_unreliable": why})
    _fake_validator(monkeypatch, report, [])
    drafter = drafter_copy("dflash-b16")
    _card(drafter, "license: mit\n")
    r = _release(drafter, target_gguf, "F16", tmp_path / "rel", target_license_id="mit", name="T")
    assert r.variants[0].validation["speedup"] is None and r.variants[0].validation["speedup_unreliable"] == why
    assert _rows(_front(tmp_path / "rel" / "README.md")[1])["dflash-T-F16.gguf"][5:] == ["1.96", "not measured reliably"]


def test_validation_runs_on_the_releases_build_and_server_args(drafter_copy, target_gguf, tmp_path,
                                                               monkeypatch, llama_bin):
    calls: list = []
    _fake_validator(monkeypatch, validation_report(), calls)
    drafter = drafter_copy("dflash-b16")
    _card(drafter, "license: mit\n")
    _release(drafter, target_gguf, "F16", tmp_path / "rel", target_license_id="mit", name="T",
            llama_bin=llama_bin, backend="cpu", server_args=["-c", "2048", "-fa", "on"])
    settings = calls[0][3]
    assert (settings.llama_bin, settings.backend, settings.server_args) == (llama_bin, "cpu", ["-c", "2048", "-fa", "on"])


def test_server_args_the_runner_manages_are_refused_before_any_work(drafter_copy, target_gguf, tmp_path):
    drafter = drafter_copy("dflash-b16")
    _card(drafter, "license: mit\n")
    proc = dflash_gguf("release", drafter, "--target", target_gguf, "--types", "F16", "-o", tmp_path / "rel",
                       "--target-license", "mit", "--", "-md", "other.gguf")
    assert_refused(proc, "-md after --: the drafter is --draft")
    assert not (tmp_path / "rel").exists()


def test_a_failed_validation_stops_the_release(drafter_copy, target_gguf, tmp_path, monkeypatch):
    _fake_validator(monkeypatch, validation_report(speedup=0.5, divergences=[{"kind": "mismatch"}]), [])
    drafter = drafter_copy("dflash-b16")
    _card(drafter, "license: mit\n")
    with pytest.raises(DflashError, match="validation failed: with the drafter, 1 token"):
        _release(drafter, target_gguf, "F16", tmp_path / "rel", target_license_id="mit", name="T")
    assert list(tmp_path.iterdir()) == [drafter]


def test_a_target_folder_is_not_validated(drafter_copy, fixtures, tmp_path, monkeypatch):
    calls: list = []
    _fake_validator(monkeypatch, None, calls)
    drafter = drafter_copy("dflash-b16")
    _card(drafter, "license: mit\n")
    r = _release(drafter, fixtures / "target-hf", "F16", tmp_path / "rel", target_license_id="mit", name="T")
    assert calls == []
    assert r.variants[0].validation["note"].startswith("not validated (the target was given as a folder")
    assert _rows(_front(tmp_path / "rel" / "README.md")[1])["dflash-T-F16.gguf"][5] == "not validated"


# -- refusals write nothing ----------------------------------------------------------------------

@pytest.mark.parametrize("license_id", ["cc-by-nd-4.0", "cc-by-nc-nd-4.0"])
def test_no_derivatives_drafter_is_refused_and_nothing_written(drafter_copy, target_gguf, tmp_path, license_id):
    drafter = drafter_copy("dflash2-b8")
    _card(drafter, f"license: {license_id}\n")
    parent = tmp_path / "out"
    parent.mkdir()
    proc = dflash_gguf("release", drafter, "--target", target_gguf, "--types", "F16,Q4_K_M", "-o", parent / "rel",
                       "--target-license", "apache-2.0", "--skip-validate")
    assert_refused(proc, license_id, "NoDerivatives")
    assert list(parent.iterdir()) == []


def test_no_derivatives_cannot_be_overridden(drafter_copy, target_gguf, tmp_path):
    drafter = drafter_copy("dflash-b16")
    _card(drafter, "license: cc-by-nc-nd-4.0\n")
    proc = dflash_gguf("release", drafter, "--target", target_gguf, "--types", "F16", "-o", tmp_path / "rel",
                       "--license", "mit", "--target-license", "mit", "--skip-validate")
    assert_refused(proc, "declares cc-by-nc-nd-4.0")
    assert not (tmp_path / "rel").exists()


def test_refusal_leaves_an_existing_folder_untouched(drafter_copy, target_gguf, tmp_path):
    drafter = drafter_copy("dflash-b16")
    _card(drafter, "license: cc-by-nd-4.0\n")
    out = tmp_path / "rel"
    _earlier_release(out, {"README.md": "an earlier release"})
    proc = dflash_gguf("release", drafter, "--target", target_gguf, "--types", "F16", "-o", out,
                       "--target-license", "mit", "--skip-validate", "--force")
    assert_refused(proc, "NoDerivatives")
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "README.md"]
    assert (out / "README.md").read_text() == "an earlier release"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_missing_target_license_is_refused_until_given(drafter_copy, target_gguf, tmp_path):
    drafter = drafter_copy("dflash-b16")
    _card(drafter, "license: mit\n")
    out = tmp_path / "rel"
    proc = dflash_gguf("release", drafter, "--target", target_gguf, "--types", "F16", "-o", out, "--skip-validate")
    assert_refused(proc, "target declares no license", "--target-license")
    assert not out.exists()
    proc = dflash_gguf("release", drafter, "--target", target_gguf, "--types", "F16", "-o", out, "--skip-validate",
                       "--target-license", "apache-2.0")
    assert proc.returncode == 0, proc.stderr


def test_missing_drafter_license_is_refused(drafter_copy, target_gguf, tmp_path):
    proc = dflash_gguf("release", drafter_copy("dflash-b16"), "--target", target_gguf, "--types", "F16",
                       "-o", tmp_path / "rel", "--target-license", "mit", "--skip-validate")
    assert_refused(proc, "drafter declares no license", "--license")
    assert not (tmp_path / "rel").exists()


def test_existing_folder_needs_force_and_is_replaced_whole(drafter_copy, target_gguf, tmp_path):
    drafter = drafter_copy("dflash-b16")
    _card(drafter, "license: mit\n")
    out = tmp_path / "rel"
    _earlier_release(out, {"dflash-T-Q2_K.gguf": "a variant of an earlier release"})
    args = ["release", drafter, "--target", target_gguf, "--types", "F16", "-o", out, "--target-license", "mit",
            "--skip-validate", "--name", "T"]
    assert_refused(dflash_gguf(*args), "--force")
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "dflash-T-Q2_K.gguf"]
    proc = dflash_gguf(*args, "--force")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "README.md", "dflash-T-F16.gguf"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_force_never_replaces_a_folder_with_other_files(drafter_copy, target_gguf, tmp_path):
    drafter = drafter_copy("dflash-b16")
    _card(drafter, "license: mit\n")
    out = tmp_path / "work"
    (out / ".git").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    proc = dflash_gguf("release", drafter, "--target", target_gguf, "--types", "F16", "-o", out,
                       "--target-license", "mit", "--skip-validate", "--force")
    assert_refused(proc, ".git/, notes.txt", "which `dflash-gguf release` did not write")
    assert sorted(p.name for p in out.iterdir()) == [".git", "notes.txt"]


def test_a_failed_build_leaves_nothing(drafter_copy, target_gguf, tmp_path):
    drafter = drafter_copy("dflash-b16")
    _card(drafter, "license: mit\n")
    (drafter / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")  # corrupt after the checks
    out = tmp_path / "rel"
    proc = dflash_gguf("release", drafter, "--target", target_gguf, "--types", "F16", "-o", out,
                       "--target-license", "mit", "--skip-validate")
    assert_refused(proc, out=out)
    assert list(tmp_path.iterdir()) == [drafter]


def test_unknown_type_is_refused_before_anything(drafter_copy, target_gguf, tmp_path):
    proc = dflash_gguf("release", drafter_copy("dflash-b16"), "--target", target_gguf, "--types", "F16,Q7",
                       "-o", tmp_path / "rel")
    assert_refused(proc, "--types 'Q7'")
