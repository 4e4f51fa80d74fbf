"""The license rules (release/license_rules.py): reading, the drafter x target matrix, overrides,
gating, and what a release folder needs before it may be published. No llama.cpp needed."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from dflash_gguf.gguf.license import license_from_gguf
from dflash_gguf.licenses import gating_fields, kind_of, license_from_folder, normalize_id, read_card, with_override
from dflash_gguf.release import license_rules as lic
from dflash_gguf.errors import LicenseError
from dflash_gguf.licenses import Kind, License


def _lic(id_: str | None, name: str | None = None, link: str | None = None, folder: Path | None = None) -> License:
    return License(normalize_id(id_), "test card", name, link, folder)


def _card(folder: Path, front: str, body: str = "# model\n") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(f"---\n{front}---\n{body}", encoding="utf-8")
    return folder


# -- reading ------------------------------------------------------------------------------------

def test_front_matter_with_lists_and_nested_gating_fields(tmp_path):
    folder = _card(tmp_path / "m", "license: Apache-2.0\ntags:\n- a\nextra_gated_fields:\n  Company: text\n"
                                   "  I agree: checkbox\nextra_gated_prompt: 'Share contact info'\n")
    meta = read_card(folder)
    assert meta["tags"] == ["a"]
    assert gating_fields(meta) == {"extra_gated_fields": {"Company": "text", "I agree": "checkbox"},
                                       "extra_gated_prompt": "Share contact info"}
    assert license_from_folder(folder).id == "apache-2.0"


def test_no_readme_or_no_front_matter_is_a_missing_license(tmp_path):
    assert license_from_folder(tmp_path).kind is Kind.MISSING
    (tmp_path / "README.md").write_text("# just text\nlicense: mit\n")
    assert license_from_folder(tmp_path).kind is Kind.MISSING


def test_broken_front_matter_is_refused_with_the_file_named(tmp_path):
    (tmp_path / "README.md").write_text("---\nlicense: [mit\n---\n")
    with pytest.raises(LicenseError, match="README.md: front matter is not valid YAML"):
        read_card(tmp_path)
    (tmp_path / "README.md").write_text("---\nlicense: mit\n")
    with pytest.raises(LicenseError, match="never closed"):
        read_card(tmp_path)


def test_license_from_gguf_general_license(tmp_path):
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(path, "dflash")
    w.add_license("CC-BY-NC-ND-4.0")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    found = license_from_gguf(path)
    assert found.id == "cc-by-nc-nd-4.0" and found.kind is Kind.NO_DERIVATIVES
    assert "general.license" in found.source


@pytest.mark.parametrize("raw, normal", [
    ("Apache-2.0", "apache-2.0"), ("apache 2.0", "apache-2.0"), ("MIT License", "mit"),
    ("Llama-3.1", "llama3.1"), (" cc-by-nc-4.0 ", "cc-by-nc-4.0"), ("", None), (None, None), (["mit"], "mit"),
])
def test_normalize_id(raw, normal):
    assert normalize_id(raw) == normal


@pytest.mark.parametrize("id_, kind", [
    ("apache-2.0", Kind.PERMISSIVE), ("mit", Kind.PERMISSIVE), ("cc-by-4.0", Kind.PERMISSIVE),
    ("cc-by-nc-4.0", Kind.NON_COMMERCIAL), ("cc-by-nc-sa-4.0", Kind.NON_COMMERCIAL),
    ("cc-by-nd-4.0", Kind.NO_DERIVATIVES), ("cc-by-nc-nd-4.0", Kind.NO_DERIVATIVES),
    ("cc-by-nc-nd-3.0", Kind.NO_DERIVATIVES),
    ("llama2", Kind.LLAMA), ("llama3", Kind.LLAMA), ("llama3.1", Kind.LLAMA), ("llama3.2", Kind.LLAMA),
    ("llama3.3", Kind.LLAMA), ("llama4", Kind.LLAMA),
    ("unknown", Kind.UNKNOWN), ("my-own-terms", Kind.UNKNOWN), (None, Kind.MISSING),
])
def test_kinds(id_, kind):
    assert kind_of(id_) is kind


def test_other_needs_name_and_link_and_may_name_a_no_derivatives_license():
    assert _lic("other", "acme-model-license", "LICENSE").kind is Kind.OTHER
    assert _lic("other").kind is Kind.UNKNOWN
    assert _lic("other", "acme-model-license").kind is Kind.UNKNOWN
    assert _lic("other", "cc-by-nc-nd-4.0", "https://x").kind is Kind.NO_DERIVATIVES


# -- the matrix ----------------------------------------------------------------------------------

def test_permissive_drafter_and_target():
    terms = lic.effective_terms(_lic("mit"), _lic("apache-2.0"))
    assert terms.card == {"license": "mit"}  # the drafter's weights are the work
    assert not terms.non_commercial and not terms.llama and terms.notice is None


def test_non_commercial_drafter_is_carried_and_flagged():
    terms = lic.effective_terms(_lic("cc-by-nc-4.0"), _lic("apache-2.0"))
    assert terms.card == {"license": "cc-by-nc-4.0"}
    assert terms.non_commercial


def test_non_commercial_target_wins_over_a_permissive_drafter():
    terms = lic.effective_terms(_lic("mit"), _lic("cc-by-nc-sa-4.0"))
    assert terms.card == {"license": "cc-by-nc-sa-4.0"} and terms.non_commercial


@pytest.mark.parametrize("side", ["drafter", "target"])
@pytest.mark.parametrize("nd", ["cc-by-nd-4.0", "cc-by-nc-nd-4.0"])
def test_no_derivatives_on_either_side_refuses(side, nd):
    drafter, target = (_lic(nd), _lic("mit")) if side == "drafter" else (_lic("mit"), _lic(nd))
    with pytest.raises(LicenseError, match=f"{side} license {nd} .* NoDerivatives"):
        lic.effective_terms(drafter, target)


def test_missing_and_unknown_refuse_naming_the_option_to_pass():
    with pytest.raises(LicenseError, match=r"drafter declares no license .* pass --license ID"):
        lic.effective_terms(_lic(None), _lic("mit"))
    with pytest.raises(LicenseError, match=r"target license 'my-terms' .* pass --target-license ID"):
        lic.effective_terms(_lic("mit"), _lic("my-terms"))
    with pytest.raises(LicenseError) as err:
        lic.effective_terms(_lic(None), _lic(None))
    assert "--license" in str(err.value) and "--target-license" in str(err.value)


def test_llama_target_adds_notice_built_with_and_agreement():
    terms = lic.effective_terms(_lic("apache-2.0"), _lic("llama3.1"))
    assert terms.card == {"license": "llama3.1"}  # the tokenizer brings the stricter terms
    assert terms.built_with == "Built with Llama"
    assert terms.notice == ("Llama 3.1 is licensed under the Llama 3.1 Community License, Copyright © "
                            "Meta Platforms, Inc. All Rights Reserved.\n")
    assert terms.llama[0].agreement == "https://www.llama.com/llama3_1/license/"


def test_llama3_says_built_with_meta_llama_3():
    assert lic.effective_terms(_lic("llama3"), _lic("llama3")).built_with == "Built with Meta Llama 3"


def test_other_uses_license_name_and_link():
    other = _lic("other", "acme-model-license", "https://acme.example/license")
    terms = lic.effective_terms(other, _lic("apache-2.0"))
    assert terms.card == {"license": "other", "license_name": "acme-model-license",
                          "license_link": "https://acme.example/license"}


def test_two_different_restrictive_licenses_combine_as_other():
    terms = lic.effective_terms(_lic("cc-by-nc-4.0"), _lic("llama3.2"))
    assert terms.card == {"license": "other", "license_name": "cc-by-nc-4.0-and-llama3.2",
                          "license_link": lic.COMBINED_LICENSE_FILE}
    assert terms.combined and terms.non_commercial and terms.notice


def test_gating_fields_are_merged_first_card_first():
    merged = lic.merge_gating(
        {"license": "mit", "extra_gated_prompt": "drafter", "extra_gated_fields": {"Name": "text"}},
        {"extra_gated_prompt": "target", "extra_gated_fields": {"Country": "country", "Name": "x"},
         "extra_gated_button_content": "Submit"})
    assert merged == {"extra_gated_prompt": "drafter",
                      "extra_gated_fields": {"Country": "country", "Name": "text"},
                      "extra_gated_button_content": "Submit"}


# -- --license / --target-license ------------------------------------------------------------------

def test_override_fills_a_missing_or_unknown_license():
    assert with_override(_lic(None), "MIT", "--license").id == "mit"
    assert with_override(_lic("my-terms"), "apache-2.0", "--license").id == "apache-2.0"
    assert with_override(_lic("mit"), None, "--license").id == "mit"


def test_override_may_not_contradict_a_declared_license():
    with pytest.raises(LicenseError, match=r"--license mit: test card declares cc-by-nc-nd-4.0"):
        with_override(_lic("cc-by-nc-nd-4.0"), "mit", "--license")
    assert with_override(_lic("mit"), "mit", "--license").id == "mit"


def test_override_must_be_a_known_id():
    with pytest.raises(LicenseError, match="not a Hub license id"):
        with_override(_lic(None), "whatever-1.0", "--target-license")
    with pytest.raises(LicenseError, match="license_name and license_link"):
        with_override(_lic(None), "other", "--license")


# -- publishing requirements ---------------------------------------------------------------------

def _release(folder: Path, front: str, files: tuple[str, ...] = ()) -> Path:
    _card(folder, front)
    for name in files:
        (folder / name).write_text("x")
    return folder


def test_publishable_permissive_folder(tmp_path):
    assert lic.publish_problems(_release(tmp_path / "r", "license: apache-2.0\n")) == []


def test_publish_problems(tmp_path):
    assert "missing" in lic.publish_problems(tmp_path)[0]
    nd = lic.publish_problems(_release(tmp_path / "nd", "license: cc-by-nc-nd-4.0\n"))
    assert len(nd) == 1 and "NoDerivatives" in nd[0]
    assert "cannot be published" in lic.publish_problems(_release(tmp_path / "none", "tags: [gguf]\n"))[0]
    assert "NOTICE" in lic.publish_problems(_release(tmp_path / "llama", "license: llama3.3\n"))[0]
    assert lic.publish_problems(_release(tmp_path / "llama-ok", "license: llama3.3\n", ("NOTICE",))) == []
    other = "license: other\nlicense_name: acme\nlicense_link: LICENSE\n"
    assert "names a file this folder lacks" in lic.publish_problems(_release(tmp_path / "o", other))[0]
    assert lic.publish_problems(_release(tmp_path / "o2", other, ("LICENSE",))) == []
    combined = "license: other\nlicense_name: cc-by-nc-4.0-and-llama3.1\nlicense_link: LICENSES.md\n"
    assert any("NOTICE" in p for p in lic.publish_problems(_release(tmp_path / "c", combined, ("LICENSES.md",))))
