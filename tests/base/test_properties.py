"""Property-based tests (issue 22): wrong values for every declared field and every file kind, generated
by Hypothesis, through the real command line (click's runner: the console script's code in-process),
beside the hand-made corpus (tests/base/test_corpus.py). Every example must hold the corpus's invariants
(`check`): no traceback, exit 2 with one `error:` line, nothing written, no input changed; and no
token in any output, although HF_TOKEN is set and the generated text carries it.

The runs are derandomized with a fixed example budget per test, so CI sees the same examples every
time; `HYPOTHESIS_EXAMPLES=n` raises the budget locally for a longer hunt.
"""

from __future__ import annotations

import copy
import io
import json
import math
import os
import shutil
import struct
import tempfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from gguf import GGUFValueType as T

from dflash_gguf.gguf import config_values as cv
from tests.malformed import encode, rebuild_gguf, rewrite_safetensors_header
from tests.base.test_corpus import check

TOKEN = "hf_PropertyTestSecretToken0123456789abcdef"
ENV = {"HF_TOKEN": TOKEN}
EXAMPLES = int(os.environ.get("HYPOTHESIS_EXAMPLES", "0")) or None


def budget(n: int):
    """A fixed, derandomized example budget (the same examples in every run)."""
    return settings(max_examples=EXAMPLES or n, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


# -- wrong values, by the kind a field is declared with -------------------------------------------------

CONTROL_TEXT = st.sampled_from(["x\x1b[2K", "\x1b]0;problems none found\x07", "a\nb", "\u202eevil", "\udcff",
                                TOKEN, f"x {TOKEN}"])
ANY_TEXT = st.one_of(CONTROL_TEXT, st.text(max_size=8))
HUGE = st.one_of(st.integers(min_value=2 ** 64, max_value=10 ** 39), st.just(10 ** 41))
OTHER = st.one_of(st.lists(st.integers(-3, 3), min_size=1, max_size=3),
                  st.dictionaries(st.text(max_size=3), st.integers(), min_size=1, max_size=2))


def wrong(field: cv.Field) -> st.SearchStrategy:
    """Values the declaration refuses (never None: that is an absent field)."""
    if field.kind == "int":
        lo, hi = field.lo, field.hi
        out = [st.booleans(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4), CONTROL_TEXT,
               OTHER, HUGE]
        if lo is not None:
            out.append(st.integers(max_value=int(lo) - 1, min_value=int(lo) - 10 ** 6))
        if hi is not None:
            out.append(st.integers(min_value=int(hi) + 1, max_value=int(hi) + 10 ** 12))
        return st.one_of(out)
    if field.kind == "float":
        out = [st.booleans(), st.text(max_size=4), CONTROL_TEXT, OTHER, st.sampled_from([math.nan, math.inf, -math.inf]),
               st.floats(min_value=3.5e38, max_value=1e308), st.floats(max_value=-3.5e38, min_value=-1e308)]
        if field.positive:
            out.append(st.floats(max_value=0, min_value=-1e30, allow_nan=False))
        if field.hi is not None:
            out.append(st.floats(min_value=field.hi, max_value=1e30, exclude_min=True))
        return st.one_of(out)
    if field.kind == "bool":
        return st.one_of(st.integers(), st.sampled_from(["false", "true", "no", "0"]), CONTROL_TEXT, OTHER, st.floats())
    if field.kind == "str":
        return st.one_of(st.integers(), st.booleans(), CONTROL_TEXT, st.lists(st.text(max_size=3), min_size=1, max_size=2),
                         st.text(min_size=int(field.hi or cv.v.MAX_STRING) + 1, max_size=int(field.hi or 0) + 8,
                                 alphabet="ab"))
    if field.kind == "str-list":
        return st.one_of(st.integers(), ANY_TEXT, st.lists(st.one_of(st.integers(), st.booleans(), CONTROL_TEXT),
                                                           min_size=1, max_size=3))
    if field.kind == "int-list":
        bad_item = st.one_of(st.booleans(), st.text(max_size=3), st.floats(), HUGE,
                             st.integers(max_value=int(field.lo or 0) - 1, min_value=-10 ** 6))
        return st.one_of(st.integers(), ANY_TEXT, st.just([]),
                         st.lists(bad_item, min_size=1, max_size=3))
    if field.kind == "object":
        return st.one_of(st.integers(), st.booleans(), ANY_TEXT, st.lists(st.integers(), min_size=1, max_size=2))
    raise AssertionError(field.kind)


def truthy(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return strategy.filter(bool)


# -- where each config.json field sits, and what makes the converter read it ----------------------------

YARN = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096}
FP8 = {"quant_method": "fp8"}
CT = {"quant_method": "compressed-tensors", "format": "float-quantized"}
CT_WEIGHTS = {**CT, "config_groups": {"g": {"weights": {"type": "float", "num_bits": 8}}}}
# field -> (path in config.json, the context that makes it read, wrong values must be truthy)
PLACES = {
    "mask_token_id": ("dflash_config.mask_token_id", {}, False),
    "target_layer_ids": ("dflash_config.target_layer_ids", {}, False),
    "num_target_layers": ("num_target_layers", {"dflash_config": {"mask_token_id": 5}}, False),
    "aux_hidden_state_layer_ids": ("aux_hidden_state_layer_ids", {"dflash_config": None}, False),
    "conv_kernel_size": ("conv_kernel_size", {"conv_kernel_size": 3, "conv_group_size": 16}, False),
    "conv_group_size": ("conv_group_size", {"conv_kernel_size": 3, "conv_group_size": 16}, False),
    "selector_rank": ("selector_rank", {"selector_rank": 4, "selector_top_k": 2}, False),
    "selector_top_k": ("selector_top_k", {"selector_rank": 4, "selector_top_k": 2}, False),
    "original_max_position_embeddings": ("rope_scaling.original_max_position_embeddings", {"rope_scaling": YARN}, False),
    "rope_scaling.rope_type": ("rope_scaling.rope_type", {"rope_scaling": {"factor": 2.0}}, True),
    "attention_value_scale": ("dflash_config.attention_value_scale", {}, False),
    "dflash_config.causal": ("dflash_config.causal", {}, False),
    "dflash_config.use_swa": ("dflash_config.use_swa", {}, False),
    "dflash_config.swa_window_size": ("dflash_config.swa_window_size", {}, False),
    "layer_types": ("layer_types", {"use_sliding_window": True, "sliding_window": 8}, False),
    "rope_parameters": ("rope_parameters", {}, True),
    "quantization_config.quant_method": ("quantization_config.quant_method", {"quantization_config": {}}, False),
    "quantization_config.fmt": ("quantization_config.fmt", {"quantization_config": FP8}, False),
    "quantization_config.format": ("quantization_config.format", {"quantization_config": {"quant_method": "x"}}, False),
    "quantization_config.weight_block_size": ("quantization_config.weight_block_size", {"quantization_config": FP8}, False),
    "quantization_config.config_groups": ("quantization_config.config_groups", {"quantization_config": CT}, False),
    "quantization_config.config_groups.weights": ("quantization_config.config_groups.g.weights",
                                                  {"quantization_config": CT_WEIGHTS}, False),
    **{f"quantization_config.config_groups.weights.{name}": (f"quantization_config.config_groups.g.weights.{name}",
                                                             {"quantization_config": CT_WEIGHTS}, truth)
       for name, truth in (("type", False), ("num_bits", False), ("block_structure", True), ("group_size", True))},
}
for _name in ("factor", "extrapolation_factor", "attention_factor", "beta_fast", "beta_slow"):
    PLACES[f"rope_scaling.{_name}"] = (f"rope_scaling.{_name}", {"rope_scaling": YARN}, False)
# read elsewhere: a target folder's config (test_target_folder_fields), a DSpark checkpoint or a
# drafter with its own mask embedding (tests/convert/test_convert_dspark.py, tests/convert/test_convert_sinks_mask.py)
TARGET_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "text_config", "rope_scaling", "_name_or_path")
ELSEWHERE = {"text_config", "_name_or_path", "tie_word_embeddings", "draft_vocab_size", "sample_from_anchor",
             "markov_head_type"}
CHECKPOINT_FIELDS = sorted(set(cv.FIELDS) - ELSEWHERE)


def _place(config: dict, path: str, value) -> None:
    *parents, leaf = path.split(".")
    node = config
    for key in parents:
        node = node.setdefault(key, {}) if isinstance(node.get(key), dict) or key not in node else node[key]
    if value is None:
        node.pop(leaf, None)
    else:
        node[leaf] = value


def _configured(base: Path, where: Path, changes: dict) -> Path:
    shutil.copytree(base, where)
    path = where / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        _place(config, key, copy.deepcopy(value))
    path.write_text(json.dumps(config))
    return where


@pytest.fixture(scope="module")
def small(fixtures: Path, target_gguf: Path, tmp_path_factory) -> dict[str, Path]:
    """The tiny drafter and target with a 256-token vocabulary (the real 151,936 tokens cost a second a
    parse, and every example parses the target): what every example starts from."""
    folder = tmp_path_factory.mktemp("properties")
    tokens = {"tokenizer.ggml.tokens": encode(T.ARRAY, [f"t{i}" for i in range(256)], T.STRING),
              "tokenizer.ggml.token_type": encode(T.ARRAY, [1] * 256, T.INT32)}
    target = rebuild_gguf(target_gguf, folder / "target.gguf", kv=lambda kvs: [
        (k, tokens.get(k, v)) for k, v in kvs if k != "tokenizer.ggml.merges"])
    ckpt = _configured(fixtures / "dflash-b16", folder / "ckpt", {"vocab_size": 256,
                                                                  "dflash_config.mask_token_id": 5})
    out = folder / "ok.gguf"
    check(["convert", ckpt, "--target", target, "-o", out], {0}, inputs=[ckpt, target], outputs=[out])
    return {"ckpt": ckpt, "target": target}


def _no_secret(*texts: str) -> None:
    for text in texts:
        assert TOKEN not in text


def test_every_declared_field_is_generated():
    assert set(CHECKPOINT_FIELDS) | ELSEWHERE == set(cv.FIELDS)
    assert set(TARGET_FIELDS) <= set(cv.FIELDS) and {"text_config", "_name_or_path"} <= set(TARGET_FIELDS)
    assert set(PLACES) <= set(cv.FIELDS), set(PLACES) - set(cv.FIELDS)


@pytest.mark.parametrize("name", CHECKPOINT_FIELDS)
def test_wrong_config_values_are_refused(small, name, tmp_path_factory):
    field = cv.FIELDS[name]
    path, context, must_be_truthy = PLACES.get(name, (name, {}, False))
    values = truthy(wrong(field)) if must_be_truthy else wrong(field)

    @budget(3)
    @given(values)
    def run(value):
        with tempfile.TemporaryDirectory(dir=tmp_path_factory.getbasetemp()) as tmp:
            ckpt = _configured(small["ckpt"], Path(tmp) / "ckpt", {**context, path: value})
            out = Path(tmp) / "out.gguf"
            _, stdout, stderr = check(["convert", ckpt, "--target", small["target"], "-o", out], {2},
                                      inputs=[ckpt], outputs=[out], env=ENV)
            assert "config.json" in stderr, (name, value, stderr)
            _no_secret(stdout, stderr)

    run()


@pytest.mark.parametrize("name", TARGET_FIELDS)
def test_target_folder_fields(fixtures, target_gguf, name, tmp_path_factory):
    field = cv.FIELDS[name]
    values = truthy(wrong(field)) if name in ("rope_scaling", "text_config") else wrong(field)

    @budget(2)
    @given(values)
    def run(value):
        with tempfile.TemporaryDirectory(dir=tmp_path_factory.getbasetemp()) as tmp:
            target = Path(tmp) / "target-hf"
            shutil.copytree(fixtures / "target-hf", target, ignore=shutil.ignore_patterns("*.safetensors"))
            config = json.loads((target / "config.json").read_text())
            config[name] = value
            (target / "config.json").write_text(json.dumps(config))
            out = Path(tmp) / "out.gguf"
            _, stdout, stderr = check(["convert", fixtures / "dflash-b16", "--target", target, "-o", out], {2},
                                      inputs=[target], outputs=[out], env=ENV)
            _no_secret(stdout, stderr)

    run()


# -- other file kinds -------------------------------------------------------------------------------

JSON_VALUES = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(),
                                     ANY_TEXT), lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                        st.dictionaries(ANY_TEXT, inner, max_size=3)),
                           max_leaves=6)


@budget(25)
@given(shards=st.one_of(JSON_VALUES, st.dictionaries(st.text(max_size=4), st.one_of(
    ANY_TEXT, st.sampled_from(["../model.safetensors", "/etc/passwd", "/proc/self/environ", "a/../../x.safetensors",
                               "model.safetensors/..", "..\\model.safetensors", ""]), JSON_VALUES), min_size=1, max_size=3)))
def test_index_files(small, tmp_path_factory, shards):
    with tempfile.TemporaryDirectory(dir=tmp_path_factory.getbasetemp()) as tmp:
        ckpt = Path(tmp) / "ckpt"
        shutil.copytree(small["ckpt"], ckpt)
        (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": shards}))
        out = Path(tmp) / "out.gguf"
        _, stdout, stderr = check(["convert", ckpt, "--target", small["target"], "-o", out], {2}, inputs=[ckpt],
                                  outputs=[out], env=ENV)
        _no_secret(stdout, stderr)


HEADER_FIELDS = st.sampled_from(["dtype", "shape", "data_offsets"])


@budget(25)
@given(field=HEADER_FIELDS, value=JSON_VALUES)
def test_safetensors_header_values(small, tmp_path_factory, field, value):
    with tempfile.TemporaryDirectory(dir=tmp_path_factory.getbasetemp()) as tmp:
        ckpt = Path(tmp) / "ckpt"
        shutil.copytree(small["ckpt"], ckpt)

        def edit(header):
            name = next(k for k in header if k != "__metadata__")
            header[name][field] = value
            return header

        rewrite_safetensors_header(ckpt / "model.safetensors", edit)
        out = Path(tmp) / "out.gguf"
        _, stdout, stderr = check(["convert", ckpt, "--target", small["target"], "-o", out], {2}, inputs=[ckpt],
                                  outputs=[out], env=ENV)
        _no_secret(stdout, stderr)


YAML_TEXT = st.one_of(
    st.text(alphabet="ab:-[]{}&*!|>#'\"\n\t %@`,?\x1b\x07", max_size=60),
    st.sampled_from(["a: &x [1]\nb: *x\n", "license: !!python/object:os.system ls\n", "license: " + "[" * 100,
                     "license:\n  - " + "\n  - ".join(["x"] * 3), "license_name: \"\\e[2K\"\n",
                     f"license: mit\nlicense_name: \"{TOKEN}\\u001b\"\n", "license: mit\nlicense_link: [1]\n",
                     "license: mit\nsize: " + "9" * 5000 + "\n", "license: mit\ndate: 2024-13-45\n"]))


@budget(25)
@given(front=YAML_TEXT)
def test_card_front_matter(small, tmp_path_factory, front):
    """A drafter card is read by convert (general.license): any front matter ends in a GGUF or one line."""
    with tempfile.TemporaryDirectory(dir=tmp_path_factory.getbasetemp()) as tmp:
        ckpt = Path(tmp) / "ckpt"
        shutil.copytree(small["ckpt"], ckpt)
        (ckpt / "README.md").write_text(f"---\n{front}\n---\n# card\n", errors="surrogateescape")
        out = Path(tmp) / "out.gguf"
        status, stdout, stderr = check(["convert", ckpt, "--target", small["target"], "-o", out], {0, 2},
                                       inputs=[ckpt], outputs=[out], env=ENV)
        _no_secret(stdout, stderr)
        if status == 0:
            from dflash_gguf.gguf.reader import GGUFFile
            from dflash_gguf.terminal import has_control

            with GGUFFile(out) as f:
                for key in ("general.license", "general.license.name", "general.license.link"):
                    value = f.get(key)
                    assert value is None or (not has_control(value) and TOKEN not in value), (key, value)


GENERAL_KEYS = st.sampled_from(["general.name", "general.license", "general.repo_url", "general.architecture",
                                "general.license.name", "general.basename"])
GGUF_VALUES = st.one_of(
    st.integers(0, 2 ** 32 - 1).map(lambda v: encode(T.UINT32, v)),
    st.floats(width=32, allow_nan=True).map(lambda v: encode(T.FLOAT32, v)),
    st.binary(min_size=1, max_size=6).filter(lambda b: not _utf8(b)).map(lambda b: struct.pack("<IQ", T.STRING, len(b)) + b),
    CONTROL_TEXT.filter(lambda t: t != "\udcff").map(lambda t: encode(T.STRING, t)),
    st.lists(st.text(max_size=3), max_size=2).map(lambda v: encode(T.ARRAY, v, T.STRING)))


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@budget(20)
@given(key=GENERAL_KEYS, encoded=GGUF_VALUES)
def test_target_gguf_general_metadata(small, tmp_path_factory, key, encoded):
    with tempfile.TemporaryDirectory(dir=tmp_path_factory.getbasetemp()) as tmp:
        bad = rebuild_gguf(small["target"], Path(tmp) / "target.gguf",
                           kv=lambda kvs: [(k, v) for k, v in kvs if k != key] + [(key, encoded)])
        out = Path(tmp) / "out.gguf"
        _, stdout, stderr = check(["convert", small["ckpt"], "--target", bad, "-o", out], {2},
                                  inputs=[bad], outputs=[out], env=ENV)
        _no_secret(stdout, stderr)


def _torch_zip(members: dict[str, bytes], compression=zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


PICKLES = st.one_of(
    st.binary(max_size=64),
    st.builds(lambda data: _torch_zip({"archive/data.pkl": data}), st.binary(max_size=64)),
    st.builds(lambda obj: _torch_zip({"archive/data.pkl": __import__("pickle").dumps(obj, protocol=2)}),
              st.one_of(JSON_VALUES, st.dictionaries(st.sampled_from(["mask_token_id", "embedding"]), JSON_VALUES,
                                                     min_size=1))),
    st.builds(lambda data: _torch_zip({"archive/data.pkl": data}, zipfile.ZIP_LZMA), st.binary(max_size=16)),
    st.just(b"PK\x03\x04" + b"\0" * 40))


@budget(25)
@given(data=PICKLES)
def test_mask_embedding_files(small, tmp_path_factory, data):
    with tempfile.TemporaryDirectory(dir=tmp_path_factory.getbasetemp()) as tmp:
        ckpt = Path(tmp) / "ckpt"
        shutil.copytree(small["ckpt"], ckpt)
        (ckpt / "mask_embedding.pt").write_bytes(data)
        out = Path(tmp) / "out.gguf"
        _, stdout, stderr = check(["convert", ckpt, "--target", small["target"], "-o", out], {2}, inputs=[ckpt],
                                  outputs=[out], env=ENV)
        assert "mask_embedding.pt" in stderr, stderr
        _no_secret(stdout, stderr)
