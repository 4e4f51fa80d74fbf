"""The z-lab reference's runs are kept in the cache: a second run of the same pair on the same prompts
reads them back (the models are not loaded), anything else about the inputs runs it again, and a
cache file someone changed is not believed."""

from __future__ import annotations

import json
import shutil

import pytest

from dflash_gguf.validation import reference

TRAINED = reference.Path(__file__).parents[1] / "fixtures" / "trained"
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11]]
N = 4

pytestmark = pytest.mark.torch


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_GGUF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "reference"


def _loads(monkeypatch) -> list[int]:
    calls = []
    real = reference._load
    monkeypatch.setattr(reference, "_load", lambda *a: (calls.append(1), real(*a))[1])
    return calls


def test_a_second_run_is_read_back_and_other_inputs_run_again(cache, monkeypatch, tmp_path):
    loads = _loads(monkeypatch)
    first = reference.run_reference(TRAINED / "dflash", TRAINED / "target", PROMPTS, N)
    assert len(loads) == 1 and len(list(cache.glob("*.json"))) == 1
    assert reference.run_reference(TRAINED / "dflash", TRAINED / "target", PROMPTS, N) == first
    assert len(loads) == 1
    reference.run_reference(TRAINED / "dflash", TRAINED / "target", PROMPTS, N + 1)  # another length
    assert len(loads) == 2
    changed = tmp_path / "dflash"
    shutil.copytree(TRAINED / "dflash", changed)
    config = json.loads((changed / "config.json").read_text())
    (changed / "config.json").write_text(json.dumps({**config, "unused_note": 1}))  # any byte of the folder
    reference.run_reference(changed, TRAINED / "target", PROMPTS, N)
    assert len(loads) == 3


@pytest.mark.parametrize("tampered", ['[{"tokens": [1], "acceptance_lengths": ["x"]}]', "not json"])
def test_a_changed_cache_file_is_not_believed(cache, monkeypatch, tampered):
    first = reference.run_reference(TRAINED / "dflash", TRAINED / "target", PROMPTS, N)
    (kept,) = cache.glob("*.json")
    kept.write_text(tampered)
    loads = _loads(monkeypatch)
    assert reference.run_reference(TRAINED / "dflash", TRAINED / "target", PROMPTS, N) == first
    assert len(loads) == 1 and json.loads(kept.read_text()) == [vars(r) for r in first]


@pytest.mark.torch
def test_the_reference_target_class_follows_the_family(tmp_path):
    """A multimodal family with no causal-LM class (MuseGlimmer) runs as image-text-to-text on text alone;
    a model transformers has no class for is one line, not a traceback."""
    from dflash_gguf.errors import InputError

    for model_type, expected in (("llama", "AutoModelForCausalLM"), ("muse_glimmer", "AutoModelForImageTextToText")):
        folder = tmp_path / model_type
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
        assert reference.target_class(folder).__name__ == expected
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "config.json").write_text(json.dumps({"model_type": "no_such_model"}))
    with pytest.raises(InputError, match="'no_such_model' has no causal-LM model in transformers"):
        reference.target_class(odd)
