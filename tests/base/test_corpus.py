"""The hostile-input corpus (issue 14): generated instances of every class of bad input, run through
every command, each checked against the same invariants:

- no traceback: an unhandled exception is a failure whatever the exit status;
- the exit status is in the documented set (0 done, 1 "problems found" for inspect only, 2 bad input,
  128+N for signal N), and a refusal is one line starting with "error: ";
- nothing is written on refusal: no output, no hidden `.partial` file or folder;
- no input is modified (every input file's sha256 before and after);
- nothing outside a folder is read into a release or an upload.

Most cases run in-process (click's runner: the same code as the console script, without a new
interpreter per case); those that could hang (FIFOs, silent servers) or need signals run as
subprocesses with a timeout. Instances are generated from the tiny fixtures, so new fields or
values are one line each.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from gguf import GGUFValueType as T

from dflash_gguf.cli import main
from dflash_gguf.runner import build
from tests.malformed import (deep_json, edit_config, encode, nested_array, rebuild_gguf, rewrite_safetensors_header,
                             sparse_checkpoint, truncate, write_config)
from tests.warm import run_cli

HANG_LIMIT = 30  # seconds any subprocess case may take; a hang fails the case
SECRET = b"SECRET-OUTSIDE-BYTES-4242"


# -- running a case and checking the invariants ----------------------------------------------------------

def _digests(paths) -> dict[str, str]:
    out = {}
    for root in paths:
        root = Path(root)
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
        for p in files:
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _leftovers(outputs) -> list[Path]:
    found = []
    for out in map(Path, outputs):
        found += [p for p in out.parent.glob(f".{out.name}*") if p.name.endswith(".partial")]
    return found


def check(args, codes, inputs=(), outputs=(), env=None, isolated: bool = False) -> tuple[int, str, str]:
    """Run the command and assert every invariant; (status, stdout, stderr). In-process, or, when it
    could block (`isolated`: a FIFO among the inputs), as a subprocess that may not outlive HANG_LIMIT."""
    before = _digests(inputs)
    if isolated:
        proc = run_cli(args, timeout=HANG_LIMIT, env=env)
        status, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    else:
        result = CliRunner().invoke(main, [str(a) for a in args], env=env, catch_exceptions=True)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            import traceback

            tb = "".join(traceback.format_exception(result.exception))
            pytest.fail(f"traceback for {args}:\n{tb}")
        status, stdout, stderr = result.exit_code, result.stdout, result.stderr
    assert status in codes, (args, status, stderr)
    assert "Traceback" not in stderr
    if status == 2:
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    if status != 0:
        assert not [o for o in outputs if Path(o).exists() and str(o) not in before], (args, stderr)
    assert not _leftovers(outputs), _leftovers(outputs)
    assert _digests(inputs) == before, f"an input changed: {args}"
    return status, stdout, stderr


# -- shared material ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def base(fixtures: Path, target_gguf: Path, tmp_path_factory) -> dict[str, Path]:
    """One converted drafter and the fixture paths, made once for the module."""
    from dflash_gguf.convert.converter import convert

    folder = tmp_path_factory.mktemp("corpus-base")
    full = folder / "full.gguf"
    convert(fixtures / "dflash-b16", target_gguf, full, "f16")
    # the same drafter with a 256-token vocabulary: the real 151,936 tokens cost a second a parse
    small = {"tokenizer.ggml.tokens": encode(T.ARRAY, [f"t{i}" for i in range(256)], T.STRING),
             "tokenizer.ggml.token_type": encode(T.ARRAY, [1] * 256, T.INT32),
             "tokenizer.ggml.mask_token_id": encode(T.UINT32, 5)}
    drafter = rebuild_gguf(full, folder / "dflash-b16.gguf", kv=lambda kvs: [
        (k, small.get(k, v)) for k, v in kvs if k != "tokenizer.ggml.merges"])
    return {"drafter": drafter, "full_drafter": full, "target": target_gguf, "fixtures": fixtures}


def _ckpt(base, tmp_path: Path, name: str = "dflash-b16") -> Path:
    dst = tmp_path / name
    shutil.copytree(base["fixtures"] / name, dst)
    return dst


# -- class 4/5: config.json values -------------------------------------------------------------------------

BAD_NUMBERS = {"negative": -1, "zero": 0, "float": 256.9, "string": "64", "bool": True, "list": [64],
               "object": {"a": 1}, "huge": 10 ** 12, "nan": math.nan}
SIZE_FIELDS = ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads", "intermediate_size",
               "head_dim", "num_key_value_heads", "max_position_embeddings")
DFLASH_FIELDS = ("dflash__block_size", "dflash__mask_token_id", "block_size")
CONFIG_CASES = {f"{field}={label}": {field: value} for field in SIZE_FIELDS + DFLASH_FIELDS
                for label, value in BAD_NUMBERS.items()
                if not (field == "dflash__mask_token_id" and label in ("zero",))}
CONFIG_CASES.update({
    "block_size=1": {"dflash__block_size": 1},
    "rms_norm_eps=nan": {"rms_norm_eps": math.nan}, "rms_norm_eps=-1": {"rms_norm_eps": -1.0},
    "rms_norm_eps=string": {"rms_norm_eps": "1e-6"}, "rope_theta=0": {"rope_theta": 0},
    "rope_theta=inf": {"rope_theta": math.inf}, "is_causal=no": {"is_causal": "no"}, "is_causal=1": {"is_causal": 1},
    "dflash_config=list": {"dflash_config": [1, 2]}, "dflash_config=string": {"dflash_config": "x"},
    "architectures=string": {"architectures": "DFlashDraftModel"}, "architectures=ints": {"architectures": [1]},
    "target_layer_ids=bools": {"dflash__target_layer_ids": [True, False]},
    "target_layer_ids=negative": {"dflash__target_layer_ids": [-1, 2]},
    "target_layer_ids=empty": {"dflash__target_layer_ids": []},
    "target_layer_ids=strings": {"dflash__target_layer_ids": ["0", "2"]},
    "target_layer_ids=duplicate": {"dflash__target_layer_ids": [2, 2]},
    "target_layer_ids=floats": {"dflash__target_layer_ids": [0.5, 2]},
    "rope_scaling=list": {"rope_scaling": [1]}, "rope_scaling=bad-factor": {"rope_scaling": {"rope_type": "linear", "factor": "2"}},
    "layer_types=ints": {"use_sliding_window": True, "sliding_window": 8, "layer_types": [1, 2]},
    "use_sliding_window=string": {"use_sliding_window": "yes", "sliding_window": 8},
    "sliding_window=float": {"use_sliding_window": True, "sliding_window": 8.5},
    "partial_rotary_factor=2": {"partial_rotary_factor": 2.0},
    "output_multiplier=string": {"dflash__output_multiplier": "x"},
    "num_hidden_layers=1e6": {"num_hidden_layers": 10 ** 6}, "num_hidden_layers=1e9": {"num_hidden_layers": 10 ** 9},
    "num_target_layers-only-huge": {"dflash__target_layer_ids": None, "num_target_layers": 10 ** 9},
    "rope_is_neox_style=string": {"rope_is_neox_style": "false"},
})
WHOLE_CONFIGS = {"list": [1, 2], "string": '"config"', "null": "null", "not-json": "{nope", "deep": deep_json(100_000),
                 "empty": "", "binary": "\udcff"}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_config_values(base, tmp_path, case):
    ckpt = edit_config(_ckpt(base, tmp_path), **CONFIG_CASES[case])
    out = tmp_path / "out.gguf"
    status, _, stderr = check(["convert", ckpt, "--target", base["target"], "-o", out], {2},
                              inputs=[ckpt], outputs=[out])
    assert "config.json" in stderr or "model.safetensors" in stderr, stderr


@pytest.mark.parametrize("case", sorted(WHOLE_CONFIGS))
def test_whole_config_files(base, tmp_path, case):
    ckpt = _ckpt(base, tmp_path)
    text = WHOLE_CONFIGS[case]
    if case == "binary":
        (ckpt / "config.json").write_bytes(b"\xff\xfe{")
    else:
        write_config(ckpt, text)
    out = tmp_path / "out.gguf"
    check(["convert", ckpt, "--target", base["target"], "-o", out], {2}, inputs=[ckpt], outputs=[out])


# -- class 4/5: safetensors headers --------------------------------------------------------------------------

def _first(header: dict) -> str:
    return next(k for k in header if k != "__metadata__")


def _set(field, value):
    def edit(h):
        h[_first(h)][field] = value
        return h
    return edit


SAFETENSORS_CASES = {
    "offsets-strings": _set("data_offsets", ["0", "16"]), "offsets-floats": _set("data_offsets", [0.0, 16.5]),
    "offsets-negative": _set("data_offsets", [-16, 0]), "offsets-one": _set("data_offsets", [0]),
    "offsets-bools": _set("data_offsets", [False, True]), "offsets-null": _set("data_offsets", None),
    "shape-strings": _set("shape", ["64"]), "shape-negative": _set("shape", [-64]), "shape-huge": _set("shape", [2 ** 62, 2 ** 62]),
    "shape-float": _set("shape", [64.5]), "dtype-unknown": _set("dtype", "Q4"), "dtype-int": _set("dtype", 5),
    "entry-string": lambda h: {**h, _first(h): "x"},
    "header-list": lambda h: [1, 2], "header-deep": lambda h: deep_json(50_000), "header-not-json": lambda h: b"{nope",
    "header-binary": lambda h: b"\xff\xfe\xfd",
    "shared-bytes": lambda h: _share(h),
}


def _share(h: dict) -> dict:
    names = [k for k in h if k != "__metadata__" and h[k]["dtype"] == "BF16"]
    a, b = next((x, y) for x in names for y in names if x != y and h[x]["shape"] == h[y]["shape"])
    h[b]["data_offsets"] = list(h[a]["data_offsets"])
    return h


@pytest.mark.parametrize("case", sorted(SAFETENSORS_CASES))
def test_safetensors_headers(base, tmp_path, case):
    ckpt = _ckpt(base, tmp_path)
    rewrite_safetensors_header(ckpt / "model.safetensors", SAFETENSORS_CASES[case])
    out = tmp_path / "out.gguf"
    check(["convert", ckpt, "--target", base["target"], "-o", out], {2}, inputs=[ckpt], outputs=[out])


@pytest.mark.parametrize("keep", [0.0, 0.001, 0.3, 0.999])
def test_truncated_safetensors(base, tmp_path, keep):
    ckpt = _ckpt(base, tmp_path)
    truncate(ckpt / "model.safetensors", keep)
    out = tmp_path / "out.gguf"
    check(["convert", ckpt, "--target", base["target"], "-o", out], {2}, inputs=[ckpt], outputs=[out])


# -- class 4/5: GGUF metadata and structure, through every command that reads a drafter or a target ------

def _kv_set(key, encoded):
    def edit(kvs):
        kvs = [(k, v) for k, v in kvs if k != key]
        return kvs + [(key, encoded)]
    return edit


def _kv_dup(key):
    return lambda kvs: kvs + [next((k, v) for k, v in kvs if k == key)]


def _tensor_edit(fn):
    def edit(infos):
        fn(infos)
        return infos
    return edit


A = "dflash."
GGUF_CASES = {
    "alignment-0": dict(kv=_kv_set("general.alignment", encode(T.UINT32, 0))),
    "alignment-7": dict(kv=_kv_set("general.alignment", encode(T.UINT32, 7))),
    "alignment-u8": dict(kv=_kv_set("general.alignment", encode(T.UINT8, 32))),
    "alignment-string": dict(kv=_kv_set("general.alignment", encode(T.STRING, "32"))),
    "duplicate-key": dict(kv=_kv_dup(A + "block_size")),
    "nested-array": dict(kv=_kv_set("x.nested", nested_array(2))),
    "deep-nested-array": dict(kv=_kv_set("x.deep", nested_array(20_000))),
    "huge-array-count": dict(kv=lambda kvs: kvs + [("x.huge", encode(T.ARRAY, [1], T.INT32)[:4]
                                                    + (2 ** 60).to_bytes(8, "little") + b"\0" * 8)]),
    "unknown-value-type": dict(kv=lambda kvs: kvs + [("x.bad", (99).to_bytes(4, "little") + b"\0" * 8)]),
    "block_size-0": dict(kv=_kv_set(A + "block_size", encode(T.UINT32, 0))),
    "block_size-1": dict(kv=_kv_set(A + "block_size", encode(T.UINT32, 1))),
    "block_size-1e9": dict(kv=_kv_set(A + "block_size", encode(T.UINT32, 10 ** 9))),
    "block_size-string": dict(kv=_kv_set(A + "block_size", encode(T.STRING, "16"))),
    "block_size-float": dict(kv=_kv_set(A + "block_size", encode(T.FLOAT32, 16.0))),
    "target_layers-empty": dict(kv=_kv_set(A + "target_layers", encode(T.ARRAY, [], T.INT32))),
    "target_layers-negative": dict(kv=_kv_set(A + "target_layers", encode(T.ARRAY, [-1, 3], T.INT32))),
    "target_layers-zero": dict(kv=_kv_set(A + "target_layers", encode(T.ARRAY, [0, 3], T.INT32))),
    "target_layers-strings": dict(kv=_kv_set(A + "target_layers", encode(T.ARRAY, ["1", "3"], T.STRING))),
    "target_layers-bools": dict(kv=_kv_set(A + "target_layers", encode(T.ARRAY, [True, True], T.BOOL))),
    "target_layers-scalar": dict(kv=_kv_set(A + "target_layers", encode(T.UINT32, 3))),
    "target_layers-deep": dict(kv=_kv_set(A + "target_layers", encode(T.ARRAY, [1, 99], T.INT32))),
    "block_count-huge": dict(kv=_kv_set(A + "block_count", encode(T.UINT32, 10 ** 9))),
    "block_count-string": dict(kv=_kv_set(A + "block_count", encode(T.STRING, "2"))),
    "embedding_length-string": dict(kv=_kv_set(A + "embedding_length", encode(T.STRING, "64"))),
    "mask-string": dict(kv=_kv_set("tokenizer.ggml.mask_token_id", encode(T.STRING, "1"))),
    "mask-outside": dict(kv=_kv_set("tokenizer.ggml.mask_token_id", encode(T.UINT32, 10 ** 9))),
    "architecture-int": dict(kv=_kv_set("general.architecture", encode(T.UINT32, 7))),
    "architecture-other": dict(kv=_kv_set("general.architecture", encode(T.STRING, "llama"))),
    "tokens-ints": dict(kv=_kv_set("tokenizer.ggml.tokens", encode(T.ARRAY, [1, 2], T.INT32))),
    "license-int": dict(kv=_kv_set("general.license", encode(T.UINT32, 1))),
    "eps-nan": dict(kv=_kv_set(A + "attention.layer_norm_rms_epsilon", encode(T.FLOAT32, math.nan))),
    "eps-negative": dict(kv=_kv_set(A + "attention.layer_norm_rms_epsilon", encode(T.FLOAT32, -1.0))),
    "freq-base-inf": dict(kv=_kv_set(A + "rope.freq_base", encode(T.FLOAT32, math.inf))),
    "causal-string": dict(kv=_kv_set(A + "attention.causal", encode(T.STRING, "no"))),
    "swa-pattern-short": dict(kv=lambda kvs: _kv_set(A + "attention.sliding_window_pattern",
                                                     encode(T.ARRAY, [True], T.BOOL))(
        _kv_set(A + "attention.sliding_window", encode(T.UINT32, 8))(kvs))),
    "duplicate-tensor": dict(tensors=lambda infos: infos + [list(infos[0])]),
    "overlapping-tensors": dict(tensors=_tensor_edit(lambda infos: infos[1].__setitem__(3, infos[0][3]))),
    "gap-between-tensors": dict(tensors=_tensor_edit(lambda infos: infos[-1].__setitem__(3, infos[-1][3] + 32))),
    "five-dims": dict(tensors=_tensor_edit(lambda infos: infos[0].__setitem__(1, [1, 1, 1, 1] + infos[0][1]))),
    "huge-dims": dict(tensors=_tensor_edit(lambda infos: infos[0].__setitem__(1, [2 ** 62, 2 ** 62]))),
    "zero-dim": dict(tensors=_tensor_edit(lambda infos: infos[0].__setitem__(1, [0] + infos[0][1][1:]))),
    "unknown-tensor-type": dict(tensors=_tensor_edit(lambda infos: infos[0].__setitem__(2, 999))),
    "quant-rows-misfit": dict(tensors=_tensor_edit(lambda infos: infos[0].__setitem__(2, 8))),  # Q8_0, rows of 64? ok
    "long-tensor-name": dict(tensors=_tensor_edit(lambda infos: infos[0].__setitem__(0, "x" * 80))),
    "version-1": dict(version=1),
    "data-cut": dict(data_cut=100),
}
GGUF_COMMANDS = {
    "inspect": lambda d, t, tmp: (["inspect", "--tensors", d], {0, 1, 2}, []),
    "migrate": lambda d, t, tmp: (["convert", d, "-o", tmp / "m.gguf"], {0, 2}, [tmp / "m.gguf"]),
    "as-target": lambda d, t, tmp: (["convert", t.parent / "ckpt", "--target", d, "-o", tmp / "c.gguf"], {0, 2},
                                    [tmp / "c.gguf"]),
    "quantize": lambda d, t, tmp: (["quantize", d, tmp / "q.gguf", "--type", "Q8_0", "--llama-bin", tmp],
                                   {2}, [tmp / "q.gguf"]),
}


@pytest.mark.parametrize("case", sorted(GGUF_CASES))
def test_gguf_files(base, tmp_path, case):
    bad = rebuild_gguf(base["drafter"], tmp_path / "bad.gguf", **GGUF_CASES[case])
    shutil.copytree(base["fixtures"] / "dflash-b16", tmp_path / "ckpt")
    for command, make in GGUF_COMMANDS.items():
        args, codes, outputs = make(bad, tmp_path / "x", tmp_path)
        status, stdout, _ = check(args, codes, inputs=[bad], outputs=outputs)
        if command == "inspect" and status == 0:
            assert case in ("license-int", "zero-dim", "quant-rows-misfit", "target_layers-deep"), \
                f"{case}: inspect found no problem\n{stdout}"
        if command == "inspect" and status != 2:
            json_status, report, _ = check(["inspect", "--json", bad], {status}, inputs=[bad])
            assert bool(json.loads(report)["problems"]) == (status == 1)


def test_a_well_formed_rebuild_is_accepted(base, tmp_path):
    """The surgery itself is faithful: rebuilding without edits gives a file every command accepts."""
    good = rebuild_gguf(base["drafter"], tmp_path / "good.gguf")
    status, stdout, _ = check(["inspect", good], {0}, inputs=[good])
    assert "problems        none found" in stdout


L = "dflash-draft.dflash."
LEGACY_CASES = {  # `convert old.gguf -o new.gguf` refuses each in one line naming the key, as a checkpoint's
    "mask-negative": dict(kv=_kv_set(L + "mask_token_id", encode(T.INT32, -1))),
    "mask-string": dict(kv=_kv_set(L + "mask_token_id", encode(T.STRING, "x"))),
    "mask-inf": dict(kv=_kv_set(L + "mask_token_id", encode(T.FLOAT32, math.inf))),
    "ids-strings": dict(kv=_kv_set(L + "target_layer_ids", encode(T.ARRAY, ["a", "b"], T.STRING))),
    "ids-floats": dict(kv=_kv_set(L + "target_layer_ids", encode(T.ARRAY, [0.0, 2.0], T.FLOAT32))),
    "ids-bools": dict(kv=_kv_set(L + "target_layer_ids", encode(T.ARRAY, [True, False], T.BOOL))),
    "ids-scalar": dict(kv=_kv_set(L + "target_layer_ids", encode(T.INT32, 2))),
    "ids-negative": dict(kv=_kv_set(L + "target_layer_ids", encode(T.ARRAY, [-1, -7], T.INT32))),
    "ids-twice": dict(kv=_kv_set(L + "target_layer_ids", encode(T.ARRAY, [2, 2], T.INT32))),
    "block_size-string": dict(kv=_kv_set(L + "block_size", encode(T.STRING, "16"))),
    "block_count-missing": dict(kv=lambda kvs: [(k, v) for k, v in kvs if k != "dflash-draft.block_count"]),
    "name-escape": dict(kv=_kv_set("general.name", encode(T.STRING, "x\x1b]0;pwn\x07"))),
    "license-escape": dict(kv=_kv_set("general.license", encode(T.STRING, "mit\x1b[2K"))),
    "no-fc": dict(tensors=_tensor_edit(lambda infos: [i.__setitem__(0, "zz.weight") for i in infos
                                                      if i[0] == "dflash_fc.weight"])),
}
LEGACY_NEEDLES = {"no-fc": "dflash_fc.weight", "block_count-missing": "dflash-draft.block_count",
                  "name-escape": "general.name", "license-escape": "general.license"}


@pytest.mark.parametrize("case", sorted(LEGACY_CASES))
def test_legacy_files_are_read_through_the_typed_declarations(base, tmp_path, case):
    from tests.legacy_fixture import make_legacy

    old = rebuild_gguf(make_legacy(base["drafter"], tmp_path / "legacy.gguf"), tmp_path / "old.gguf",
                       **LEGACY_CASES[case])
    out = tmp_path / "new.gguf"
    _, _, stderr = check(["convert", old, "-o", out], {2}, inputs=[old], outputs=[out])
    assert "old.gguf: " in stderr and LEGACY_NEEDLES.get(case, L) in stderr, stderr


def test_a_well_formed_legacy_file_is_migrated(base, tmp_path):
    from tests.legacy_fixture import make_legacy

    old = rebuild_gguf(make_legacy(base["drafter"], tmp_path / "legacy.gguf"), tmp_path / "old.gguf")
    out = tmp_path / "new.gguf"
    check(["convert", old, "-o", out], {0}, inputs=[old], outputs=[out])
    check(["inspect", out], {0}, inputs=[out])


# -- class 4: serve / generate / validate arguments ---------------------------------------------------------

@pytest.mark.parametrize("url", ["not a url", "ftp://127.0.0.1/", "http://", "http://127.0.0.1:99999", "http://[::1",
                                 "127.0.0.1:8080", ""])
def test_generate_url_values(url):
    check(["generate", "--url", url, "hello"], {2})


def test_generate_url_that_never_answers_times_out(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "dflash_gguf.cli", "generate", "--url",
                               f"http://127.0.0.1:{listener.getsockname()[1]}", "--timeout", "1", "hi"],
                              capture_output=True, text=True, timeout=HANG_LIMIT)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert time.monotonic() - started < 20
    finally:
        listener.close()


@pytest.mark.parametrize("command", ["serve", "generate", "validate"])
@pytest.mark.parametrize("case", ["block_size-0", "target_layers-empty", "target_layers-negative", "architecture-other",
                                  "block_size-string", "alignment-7", "data-cut"])
def test_runner_commands_refuse_broken_drafters_before_starting(base, tmp_path, command, case):
    if build.find_build("metal") is not None:
        pytest.skip("a metal build exists: the refusal would be followed by a real server start")
    bad = rebuild_gguf(base["drafter"], tmp_path / "bad.gguf", **GGUF_CASES[case])
    args = {"serve": ["serve", "-t", base["target"], "-d", bad, "--backend", "metal"],
            "generate": ["generate", "-t", base["target"], "-d", bad, "--backend", "metal", "hi"],
            "validate": ["validate", "-t", base["target"], "-d", bad, "--backend", "metal"]}[command]
    _, _, stderr = check(args, {2}, inputs=[bad, base["target"]])
    assert "metal" not in stderr, f"{case} was not refused before looking for a build: {stderr}"


# -- class 1: every output aimed at every input --------------------------------------------------------------

def _clobber_cases():
    yield "convert-o-target", lambda b, c, tmp: (["convert", c, "--target", b["t"], "-o", b["t"], "--force"], [b["t"], c])
    for name in ("model.safetensors", "config.json"):
        yield f"convert-o-{name}", lambda b, c, tmp, name=name: (
            ["convert", c, "--target", b["t"], "-o", c / name, "--force"], [b["t"], c])
    yield "quantize-out-in", lambda b, c, tmp: (["quantize", b["d"], b["d"], "--type", "Q8_0", "--force"], [b["d"]])
    yield "release-o-draft", lambda b, c, tmp: (["release", c, "--target", b["t"], "-o", c, "--force", "--types", "F16",
                                                 "--skip-validate"], [c, b["t"]])
    for opt, victim in (("--report", "t"), ("--report", "d")):
        yield f"validate{opt}-{victim}", lambda b, c, tmp, opt=opt, victim=victim: (
            ["validate", "-t", b["t"], "-d", b["d"], opt, b[victim]], [b["t"], b["d"]])
    for command in ("serve", "generate"):
        for victim in ("t", "d"):
            yield f"{command}-log-{victim}", lambda b, c, tmp, command=command, victim=victim: (
                [command, "-t", b["t"], "-d", b["d"], "--log", b[victim]] + (["hi"] if command == "generate" else []),
                [b["t"], b["d"]])


CLOBBER = dict(_clobber_cases())


@pytest.mark.parametrize("case", sorted(CLOBBER))
def test_outputs_never_replace_inputs(base, tmp_path, case):
    b = {"t": tmp_path / "target.gguf", "d": tmp_path / "dflash.gguf"}
    shutil.copyfile(base["target"], b["t"])
    shutil.copyfile(base["drafter"], b["d"])
    ckpt = _ckpt(base, tmp_path)
    args, inputs = CLOBBER[case](b, ckpt, tmp_path)
    _, _, stderr = check(args, {2}, inputs=inputs)
    assert "never replaces an input" in stderr


# -- class 6: non-regular files never block ------------------------------------------------------------------

FIFO_CASES = {
    "inspect-fifo": lambda f, b, tmp: ["inspect", f],
    "convert-fifo-target": lambda f, b, tmp: ["convert", b["ckpt"], "--target", f, "-o", tmp / "o.gguf"],
    "convert-fifo-legacy": lambda f, b, tmp: ["convert", f, "-o", tmp / "o.gguf"],
    "convert-fifo-config": lambda f, b, tmp: ["convert", b["ckpt_fifo_config"], "--target", b["target"], "-o",
                                              tmp / "o.gguf"],
    "convert-fifo-weights": lambda f, b, tmp: ["convert", b["ckpt_fifo_weights"], "--target", b["target"], "-o",
                                               tmp / "o.gguf"],
    "quantize-fifo": lambda f, b, tmp: ["quantize", f, tmp / "q.gguf", "--type", "Q8_0"],
    "validate-fifo-prompts": lambda f, b, tmp: ["validate", "-t", b["target"], "-d", b["drafter"], "--prompts", f],
    "serve-fifo-draft": lambda f, b, tmp: ["serve", "-t", b["target"], "-d", f],
}


@pytest.mark.parametrize("case", sorted(FIFO_CASES))
def test_fifos_are_refused_without_hanging(base, tmp_path, case):
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    b = dict(base)
    b["ckpt"] = _ckpt(base, tmp_path)
    b["ckpt_fifo_config"] = _ckpt(base, tmp_path / "c1")
    (b["ckpt_fifo_config"] / "config.json").unlink()
    os.mkfifo(b["ckpt_fifo_config"] / "config.json")
    b["ckpt_fifo_weights"] = _ckpt(base, tmp_path / "c2")
    (b["ckpt_fifo_weights"] / "model.safetensors").unlink()
    os.mkfifo(b["ckpt_fifo_weights"] / "model.safetensors")
    args = FIFO_CASES[case](fifo, b, tmp_path)
    proc = run_cli(args, timeout=HANG_LIMIT)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr


# -- class 2: nothing outside a folder is read -----------------------------------------------------------------

@pytest.mark.parametrize("name", ["LICENSE", "LICENSE.md", "NOTICE", "USE_POLICY.md", "README.md", "link-folder"])
def test_release_reads_nothing_outside_the_checkpoint(base, tmp_path, name):
    secret = tmp_path / "outside" / "secret"
    secret.parent.mkdir()
    secret.write_bytes(SECRET + b"\n")
    ckpt = _ckpt(base, tmp_path)
    if name == "link-folder":
        (ckpt / "README.md").write_text("---\nlicense: other\nlicense_name: x\nlicense_link: terms/secret\n---\n")
        (ckpt / "terms").symlink_to(secret.parent, target_is_directory=True)
    else:
        if name != "README.md":
            (ckpt / "README.md").write_text("---\nlicense: mit\n---\n")
        (ckpt / name).symlink_to(secret)
    out = tmp_path / "rel"
    check(["release", ckpt, "--target", base["target"], "--types", "F16", "-o", out, "--skip-validate",
           "--target-license", "mit"], {2}, inputs=[ckpt, secret], outputs=[out])
    assert not any(SECRET in p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p != secret
                   and not p.is_symlink())


# -- class 7: signals ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)])
def test_convert_cleans_up_on_terminating_signals(base, tmp_path, sig, status):
    ckpt = sparse_checkpoint(_ckpt(base, tmp_path), 1 << 17)
    out = tmp_path / "big.gguf"
    proc = subprocess.Popen([sys.executable, "-m", "dflash_gguf.cli", "convert", ckpt, "--target", base["target"],
                             "-o", out, "--outtype", "q8_0"], stderr=subprocess.PIPE, text=True,
                            # a suite started in the background inherits SIGINT ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + HANG_LIMIT
    while not _leftovers([out]) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, f"the conversion ended before it could be interrupted: {proc.stderr.read()}"
    proc.send_signal(sig)
    started = time.monotonic()
    _, stderr = proc.communicate(timeout=HANG_LIMIT)
    assert time.monotonic() - started < 5, "it took more than 5 s to stop"
    assert proc.returncode == status, stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1].startswith("interrupted"), stderr
    assert not out.exists() and not _leftovers([out])


def test_release_cleans_up_its_partial_folder_on_sigterm(base, tmp_path):
    ckpt = sparse_checkpoint(_ckpt(base, tmp_path), 1 << 17)
    (ckpt / "README.md").write_text("---\nlicense: mit\n---\n")
    out = tmp_path / "rel"
    proc = subprocess.Popen([sys.executable, "-m", "dflash_gguf.cli", "release", ckpt, "--target", base["target"],
                             "--types", "F32,F16", "-o", out, "--skip-validate", "--target-license", "mit"],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + HANG_LIMIT
    while not list(tmp_path.glob(".rel.*.partial")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=HANG_LIMIT)
    assert proc.returncode in (0, 143), stderr
    assert not list(tmp_path.glob(".rel*")), "a partial release folder was left behind"
    if proc.returncode == 143:
        assert not out.exists()


# -- class 6: work bounded by what the files hold ---------------------------------------------------------

MEMORY_LIMIT = 1536 << 20  # bytes of address space: far above what these commands need on the fixtures


def _limited():
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


@pytest.mark.parametrize("case", ["layers-1e9", "target-layers-1e9", "gguf-array-2^60", "gguf-block-count-1e9",
                                  "safetensors-shape-2^62"])
def test_absurd_counts_are_refused_within_bounded_memory(base, tmp_path, case):
    ckpt = _ckpt(base, tmp_path)
    if case == "layers-1e9":
        edit_config(ckpt, num_hidden_layers=10 ** 9)
        args = ["convert", ckpt, "--target", base["target"], "-o", tmp_path / "o.gguf"]
    elif case == "target-layers-1e9":
        edit_config(ckpt, dflash__target_layer_ids=None, num_target_layers=10 ** 9, num_hidden_layers=10 ** 9)
        args = ["convert", ckpt, "--target", base["target"], "-o", tmp_path / "o.gguf"]
    elif case == "safetensors-shape-2^62":
        rewrite_safetensors_header(ckpt / "model.safetensors", _set("shape", [2 ** 62, 2 ** 62]))
        args = ["convert", ckpt, "--target", base["target"], "-o", tmp_path / "o.gguf"]
    else:
        bad = rebuild_gguf(base["drafter"], tmp_path / "bad.gguf",
                           **GGUF_CASES["huge-array-count" if case == "gguf-array-2^60" else "block_count-huge"])
        args = ["inspect", bad]
    proc = subprocess.run([sys.executable, "-m", "dflash_gguf.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=HANG_LIMIT, preexec_fn=_limited)
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr


# -- class 4: a target given as its Hugging Face folder -----------------------------------------------------

def _tok(edit):
    def apply(folder: Path) -> None:
        path = folder / "tokenizer.json"
        spec = json.loads(path.read_text())
        path.write_text(json.dumps(edit(spec)))
    return apply


def _cfg(**changes):
    def apply(folder: Path) -> None:
        path = folder / "config.json"
        config = json.loads(path.read_text())
        config.update(changes)
        path.write_text(json.dumps(config))
    return apply


TARGET_FOLDER_CASES = {
    "hidden_size-string": _cfg(hidden_size="64"), "hidden_size-float": _cfg(hidden_size=64.5),
    "vocab_size-negative": _cfg(vocab_size=-1), "num_hidden_layers-bool": _cfg(num_hidden_layers=True),
    "text_config-list": _cfg(text_config=[1]), "rope_scaling-string": _cfg(rope_scaling="x"),
    "config-list": lambda f: (f / "config.json").write_text("[]"),
    "config-deep": lambda f: (f / "config.json").write_text(deep_json(100_000)),
    "tokenizer-list": lambda f: (f / "tokenizer.json").write_text("[]"),
    "tokenizer-model-list": _tok(lambda s: {**s, "model": [1]}),
    "tokenizer-vocab-ids-strings": _tok(lambda s: {**s, "model": {**s["model"], "vocab": {"a": "1", "b": "x"}}}),
    "tokenizer-added-strings": _tok(lambda s: {**s, "added_tokens": ["<x>"]}),
    "tokenizer-pre-string": _tok(lambda s: {**s, "pre_tokenizer": "x"}),
    "tokenizer-merges-ints": _tok(lambda s: {**s, "model": {**s["model"], "merges": [1, 2]}}),
    "tokenizer-config-list": lambda f: (f / "tokenizer_config.json").write_text("[1]"),
}


def _convert_against_edited_target(base, tmp_path, edit, statuses) -> tuple[str, Path]:
    """convert against a copy of the tiny HF target changed by `edit`: (stderr, the output path)."""
    target = tmp_path / "target-hf"
    shutil.copytree(base["fixtures"] / "target-hf", target, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    edit(target)
    out = tmp_path / "o.gguf"
    _, _, stderr = check(["convert", _ckpt(base, tmp_path), "--target", target, "-o", out], statuses,
                         inputs=[target], outputs=[out])
    return stderr, out


@pytest.mark.parametrize("case", sorted(TARGET_FOLDER_CASES))
def test_target_folders(base, tmp_path, case):
    _convert_against_edited_target(base, tmp_path, TARGET_FOLDER_CASES[case], {0, 2})


TOK = "tokenizer.ggml."
TARGET_GGUF_CASES = {  # each refused in one line naming the target and the key, never copied into the drafter
    "padding-string": (TOK + "padding_token_id", encode(T.STRING, "x")),
    "padding-nan": (TOK + "padding_token_id", encode(T.FLOAT32, math.nan)),
    "padding-array": (TOK + "padding_token_id", encode(T.ARRAY, [2], T.UINT32)),
    "eos-string": (TOK + "eos_token_id", encode(T.STRING, "x")),
    "bos-array": (TOK + "bos_token_id", encode(T.ARRAY, [2], T.UINT32)),
    "bos-bool": (TOK + "bos_token_id", encode(T.BOOL, True)),
    "eos-beyond-u32": (TOK + "eos_token_id", encode(T.UINT64, 1 << 40)),
    "fim-negative": (TOK + "fim_pre_token_id", encode(T.INT32, -1)),
    "pre-int": (TOK + "pre", encode(T.UINT32, 7)),
}


@pytest.mark.parametrize("case", sorted(TARGET_GGUF_CASES))
def test_target_gguf_tokenizer_values(base, tmp_path, case):
    key, encoded = TARGET_GGUF_CASES[case]
    target = rebuild_gguf(base["target"], tmp_path / "t.gguf", kv=_kv_set(key, encoded))
    out = tmp_path / "o.gguf"
    _, _, stderr = check(["convert", _ckpt(base, tmp_path), "--target", target, "-o", out], {2},
                         inputs=[target], outputs=[out])
    assert f"t.gguf: field '{key}'" in stderr, stderr


def _tok_config(**changes):
    def apply(folder: Path) -> None:
        path = folder / "tokenizer_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return apply


def _template_file(name: str, text: str | bytes):
    """The chat template only in `name` (gguf-py's fallback when tokenizer_config.json has none)."""
    def apply(folder: Path) -> None:
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config.pop("chat_template", None)
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
        (folder / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    return apply


TARGET_FOLDER_REFUSALS = {  # what gguf-py would skip with a warning, writing a GGUF llama.cpp cannot use
    "merges-string": (_tok(lambda s: {**s, "model": {**s["model"], "merges": "x y"}}), "tokenizer.json", "model.merges"),
    "merges-empty": (_tok(lambda s: {**s, "model": {**s["model"], "merges": []}}), "tokenizer.json", "model.merges"),
    "merges-triples": (_tok(lambda s: {**s, "model": {**s["model"], "merges": [["a", "b", "c"]]}}), "tokenizer.json",
                       "model.merges"),
    "chat-template-int": (_tok_config(chat_template=5), "tokenizer_config.json", "chat_template"),
    "chat-template-json-int": (_template_file("chat_template.json", '{"chat_template": 5}'), "chat_template.json",
                               "chat_template"),
    "chat-template-list-of-strings": (_tok_config(chat_template=["x"]), "tokenizer_config.json", "chat_template"),
}


@pytest.mark.parametrize("case", sorted(TARGET_FOLDER_REFUSALS))
def test_target_folder_values_gguf_py_would_skip_are_refused(base, tmp_path, case):
    edit, name, field = TARGET_FOLDER_REFUSALS[case]
    stderr, _ = _convert_against_edited_target(base, tmp_path, edit, {2})
    assert f"target-hf/{name}: field '{field}'" in stderr and "dflash-gguf-tokenizer" not in stderr, stderr


TEMPLATE_FILE_REFUSALS = {  # fallback files gguf-py would read and fail on (a traceback before these checks)
    "json-list": (_template_file("chat_template.json", "[1]"), "chat_template.json: not a JSON object"),
    "json-broken": (_template_file("chat_template.json", "{"), "chat_template.json"),
    "jinja-not-utf8": (_template_file("chat_template.jinja", b"{{ \xff }}"), "chat_template.jinja"),
}


@pytest.mark.parametrize("case", sorted(TEMPLATE_FILE_REFUSALS))
def test_malformed_chat_template_files_are_refused(base, tmp_path, case):
    edit, expected = TEMPLATE_FILE_REFUSALS[case]
    stderr, _ = _convert_against_edited_target(base, tmp_path, edit, {2})
    assert f"target-hf/{expected}" in stderr and "dflash-gguf-tokenizer" not in stderr, stderr


def test_a_chat_template_json_fallback_is_written_as_gguf_py_reads_it(base, tmp_path):
    from dflash_gguf.gguf.reader import GGUFFile

    edit = _template_file("chat_template.json", json.dumps({"chat_template": "{{ messages }}"}))
    _, out = _convert_against_edited_target(base, tmp_path, edit, {0})
    with GGUFFile(out) as written:
        assert written.get("tokenizer.chat_template") == "{{ messages }}"


# -- class 2/3: release folders handed to publish ------------------------------------------------------------

def _release_folder(tmp_path: Path, gguf: Path | None = None, front: str = "license: mit\n") -> Path:
    from tests.release.test_publish import _folder

    folder = _folder(tmp_path / "rel", front)
    if gguf is not None:
        shutil.copyfile(gguf, folder / "dflash-Tiny-F16.gguf")
    return folder


def _link_out(name: str):
    def apply(folder: Path, secret: Path) -> None:
        (folder / name).unlink(missing_ok=True)
        (folder / name).symlink_to(secret)
        _relist(folder)
    return apply


def _relist(folder: Path, front: str | None = None) -> None:
    readme = folder / "README.md"
    text = readme.read_text()
    listed = "".join(f"- [{p.name}](./{p.name})\n" for p in sorted(folder.iterdir()) if not p.name.startswith("."))
    head = text.split("# card")[0] if front is None else f"---\n{front}---\n"
    readme.write_text(head + "# card\n\n" + listed)


PUBLISH_CASES = {
    "link-out-license": _link_out("LICENSE"),
    "link-out-gguf": _link_out("dflash-Tiny-Q8_0.gguf"),
    "link-out-notice": _link_out("NOTICE"),
    "link-out-readme": lambda f, s: ((f / "README.md").unlink(), (f / "README.md").symlink_to(s)),
    "link-out-folder": lambda f, s: ((f / "extra").symlink_to(s.parent, target_is_directory=True), _relist(f)),
    "unlisted-file": lambda f, s: (f / "notes.txt").write_text("x"),
    "subfolder": lambda f, s: ((f / "sub").mkdir(), (f / "sub" / "a.gguf").write_text("x")),
    "fifo-listed": lambda f, s: (os.mkfifo(f / "NOTICE"), _relist(f)),
    "card-not-yaml": lambda f, s: (f / "README.md").write_text("---\nlicense: [mit\n---\n"),
    "card-unclosed": lambda f, s: (f / "README.md").write_text("---\nlicense: mit\n"),
    "card-list-front": lambda f, s: (f / "README.md").write_text("---\n- a\n- b\n---\n"),
    "card-deep-yaml": lambda f, s: (f / "README.md").write_text("---\nlicense: " + "[" * 5000 + "]" * 5000 + "\n---\n"),
    "card-license-int": lambda f, s: _relist(f, "license: 7\n"),
    "card-license-dict": lambda f, s: _relist(f, "license: {a: cc-by-nd-4.0}\n"),
    "card-link-absolute": lambda f, s: _relist(f, f"license: other\nlicense_name: x\nlicense_link: {s}\n"),
    "card-link-dotdot": lambda f, s: _relist(f, "license: other\nlicense_name: x\nlicense_link: ../outside/secret\n"),
    "card-nd-list": lambda f, s: _relist(f, "license:\n- mit\n- cc-by-nc-nd-4.0\n"),
    "card-nd-comment": lambda f, s: _relist(f, "license: cc-by-nd-4.0 # hmm\n"),
    "license-text-nd": lambda f, s: (f / "LICENSE").write_text("Attribution-NoDerivatives 4.0 International"),
    "broken-gguf": lambda f, s: (f / "dflash-Tiny-F16.gguf").write_bytes(b"GGUF" + b"\0" * 40),
}


@pytest.mark.parametrize("case", sorted(PUBLISH_CASES))
def test_publish_folders(tmp_path, case):
    secret = tmp_path / "outside" / "secret"
    secret.parent.mkdir()
    secret.write_bytes(SECRET + b"\n")
    folder = _release_folder(tmp_path)
    PUBLISH_CASES[case](folder, secret)
    _, stdout, _ = check(["publish", folder, "--repo", "me/tiny", "--dry-run", "--json"], {2}, inputs=[secret],
                         isolated="fifo" in case)
    assert SECRET.decode() not in stdout


@pytest.mark.parametrize("case", ["block_size-0", "alignment-7", "duplicate-key", "overlapping-tensors",
                                  "license-int", "data-cut"])
def test_publish_with_broken_variants(base, tmp_path, case):
    bad = rebuild_gguf(base["drafter"], tmp_path / "bad.gguf", **GGUF_CASES[case])
    folder = _release_folder(tmp_path, bad)
    check(["publish", folder, "--repo", "me/tiny", "--dry-run"], {0, 2}, inputs=[folder])


RELEASE_CASES = {
    "config-deep": lambda c: write_config(c, deep_json(100_000)),
    "config-name-list": lambda c: edit_config(c, _name_or_path=[1]),
    "card-deep-yaml": lambda c: (c / "README.md").write_text("---\nlicense: " + "[" * 5000 + "]" * 5000 + "\n---\n"),
    "card-fifo": lambda c: ((c / "README.md").unlink(), os.mkfifo(c / "README.md")),
    "license-fifo": lambda c: os.mkfifo(c / "LICENSE"),
    "card-binary": lambda c: (c / "README.md").write_bytes(b"---\nlicense: \xff\xfe\n---\n"),
    "card-gating-list": lambda c: (c / "README.md").write_text("---\nlicense: mit\nextra_gated_fields: [1, 2]\n---\n"),
    "card-license-number": lambda c: (c / "README.md").write_text("---\nlicense: 3.0\n---\n"),
    "card-link-dict": lambda c: (c / "README.md").write_text("---\nlicense: other\nlicense_name: x\nlicense_link: {a: 1}\n---\n"),
    "card-nd-text": lambda c: (c / "LICENSE.md").write_text("CC BY-NC-ND 4.0"),
}


@pytest.mark.parametrize("case", sorted(RELEASE_CASES))
def test_release_drafter_folders(base, tmp_path, case):
    ckpt = _ckpt(base, tmp_path)
    (ckpt / "README.md").write_text("---\nlicense: mit\n---\n")
    RELEASE_CASES[case](ckpt)
    out = tmp_path / "rel"
    check(["release", ckpt, "--target", base["target"], "--types", "F16", "-o", out, "--skip-validate",
           "--target-license", "mit"], {0, 2}, inputs=[p for p in ckpt.iterdir() if p.is_file()], outputs=[out],
          isolated="fifo" in case)
