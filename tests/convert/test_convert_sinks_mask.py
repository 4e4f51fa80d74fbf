"""Attention sinks and a drafter's own mask embedding (tests/fixtures/published_drafters.py:
`sinks`, `mask-embedding`, `mimo`), converted as the pinned converter does, loading and drafting
in the patched llama.cpp.

- sinks: `layers.N.self_attn.sinks` / `attention_sink_bias` -> `blk.N.attn_sinks.weight` (F32).
- mask_embedding.pt: the GGUF carries `token_embd.weight` (the target's embeddings with the mask row
  replaced) and `output.weight` (the target's head); from a GGUF target they are read from its
  tensors, dequantized when quantized.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dflash_gguf.gguf.reader import GGUFFile
from tests.conftest import dflash_gguf
from tests.fixtures.published_drafters import cached_published
from training.fixtures.gguf_compare import differences
from tests.refusal import assert_refused

MASK_FAMILIES = ["mask-embedding", "mimo"]


@pytest.fixture(scope="session")
def published() -> Path:
    return cached_published()


def _mask_vector(folder: Path) -> torch.Tensor:
    return torch.load(folder / "mask_embedding.pt", weights_only=True)["embedding"]


def _floats(f: GGUFFile, name: str) -> np.ndarray:
    info = f.tensors[name]
    raw = bytes(f.tensor_bytes(name))
    if info.type.name == "F32":
        return np.frombuffer(raw, np.float32).reshape(info.shape)
    if info.type.name == "F16":
        return np.frombuffer(raw, np.float16).astype(np.float32).reshape(info.shape)
    if info.type.name == "Q8_0":  # blocks of 32: a float16 scale then 32 int8 values
        blocks = np.frombuffer(raw, np.uint8).reshape(-1, 34)
        scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        return (scale * blocks[:, 2:].view(np.int8).astype(np.float32)).reshape(info.shape)
    raise AssertionError(f"{name}: unexpected type {info.type.name}")


# --- as the pinned converter does ---------------------------------------------------------------

@pytest.mark.upstream
@pytest.mark.parametrize("outtype", ["f16", "bf16", "q8_0"])
@pytest.mark.parametrize("family", ["sinks", *MASK_FAMILIES])
def test_matches_upstream(family, outtype, published, fixtures, tmp_path):
    from training.fixtures.upstream import run_upstream_converter

    theirs = run_upstream_converter(published / family, tmp_path / "theirs.gguf", outtype, fixtures / "target-hf")
    ours = tmp_path / "ours.gguf"
    proc = dflash_gguf("convert", published / family, "--target", fixtures / "target-hf", "-o", ours,
                       "--outtype", outtype)
    assert proc.returncode == 0, proc.stderr
    assert differences(ours, theirs) == []
    with GGUFFile(ours) as f:
        sinks = [n for n in f.tensors if n.endswith("attn_sinks.weight")]
        own = {"token_embd.weight", "output.weight"} & set(f.tensors)
    assert len(sinks) == {"sinks": 2, "mask-embedding": 0, "mimo": 3}[family]
    assert own == (set() if family == "sinks" else {"token_embd.weight", "output.weight"})


def test_sinks_are_written_as_float32(published, target_gguf, tmp_path):
    out = tmp_path / "sinks.gguf"
    proc = dflash_gguf("convert", published / "sinks", "--target", target_gguf, "-o", out, "--outtype", "f32")
    assert proc.returncode == 0, proc.stderr
    from safetensors.torch import load_file
    stored = load_file(published / "sinks" / "model.safetensors")
    with GGUFFile(out) as f:
        for i in range(2):
            assert f.tensors[f"blk.{i}.attn_sinks.weight"].type.name == "F32"
            np.testing.assert_array_equal(_floats(f, f"blk.{i}.attn_sinks.weight"),
                                          stored[f"layers.{i}.self_attn.sinks"].float().numpy())


# --- embeddings from a GGUF target, dequantized ---------------------------------------------------

@pytest.mark.parametrize("target_type", ["f16", "q8_0"])
def test_mask_embedding_from_a_gguf_target(target_type, published, fixtures, tmp_path):
    """token_embd = the target GGUF's embeddings (dequantized here by hand for Q8_0), mask row
    replaced by mask_embedding.pt; output = the target's head (tied: its embeddings, unpatched)."""
    from training.fixtures.target_model import convert_target

    target = convert_target(fixtures / "target-hf", tmp_path / f"target-{target_type}.gguf", target_type)
    out = tmp_path / "mask.gguf"
    proc = dflash_gguf("convert", published / "mask-embedding", "--target", target, "-o", out, "--outtype", "f32")
    assert proc.returncode == 0, proc.stderr
    mask_id = json.loads((published / "mask-embedding" / "config.json").read_text())["dflash_config"]["mask_token_id"]
    with GGUFFile(target) as t:
        assert t.tensors["token_embd.weight"].type.name == target_type.upper()
        embeddings = _floats(t, "token_embd.weight")
        assert "output.weight" not in t.tensors  # tied
    with GGUFFile(out) as f:
        ours_embd, ours_head = _floats(f, "token_embd.weight"), _floats(f, "output.weight")
    np.testing.assert_array_equal(ours_head, embeddings)
    assert not np.array_equal(embeddings[mask_id], ours_embd[mask_id])
    expected = embeddings.copy()
    expected[mask_id] = _mask_vector(published / "mask-embedding").float().numpy()
    if target_type == "f16":  # the mask row takes the target's precision
        expected[mask_id] = expected[mask_id].astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(ours_embd, expected)


# --- refusals ---------------------------------------------------------------------------------------

def _save_mask(folder: Path, **fields) -> None:
    data = torch.load(folder / "mask_embedding.pt", weights_only=True)
    data.update(fields)
    torch.save(data, folder / "mask_embedding.pt")


BROKEN = {
    "other-mask-id": (lambda d, t: (_save_mask(d, mask_token_id=151670), t)[1],
                      ["mask_embedding.pt", "151670", "151669"]),
    "wrong-width": (lambda d, t: (_save_mask(d, embedding=torch.zeros(32)), t)[1],
                    ["mask_embedding.pt", "[32]", "[64]"]),
    "not-a-torch-file": (lambda d, t: ((d / "mask_embedding.pt").write_bytes(b"garbage"), t)[1],
                         ["mask_embedding.pt", "torch.save"]),
    "pickled-code": (lambda d, t: (torch.save({"mask_token_id": 151669, "embedding": torch.zeros(64),
                                               "x": Path("/")}, d / "mask_embedding.pt"), t)[1],
                     ["mask_embedding.pt", "pathlib"]),
    "target-without-weights": (lambda d, t: _weightless(t), ["model.embed_tokens.weight", "GGUF"]),
}


def _weightless(target: Path) -> Path:
    for p in target.glob("*.safetensors"):
        p.unlink()
    return target


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_mask_embedding_is_refused(case, published, fixtures, tmp_path):
    folder = shutil.copytree(published / "mask-embedding", tmp_path / "drafter")
    target = shutil.copytree(fixtures / "target-hf", tmp_path / "target")
    change, needles = BROKEN[case]
    target = change(folder, target)
    out = tmp_path / "out.gguf"
    assert_refused(dflash_gguf("convert", folder, "--target", target, "-o", out), *needles, out=out)


# --- loads and drafts ---------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def f32_pair(fixtures, published, tmp_path_factory):
    """The tiny target and the published drafters (plus dflash-b16) in float32."""
    from dflash_gguf.convert.converter import convert
    from training.fixtures.target_model import convert_target

    work = tmp_path_factory.mktemp("f32-published")
    models = {"target": convert_target(fixtures / "target-hf", work / "target.gguf", "f32")}
    for name, folder in [("dflash-b16", fixtures / "dflash-b16"), ("sinks", published / "sinks"),
                         ("mask-embedding", published / "mask-embedding"), ("mimo", published / "mimo")]:
        models[name] = work / f"{name}.gguf"
        convert(folder, models["target"], models[name], "f32")
    return models


def _first_draft(llama_bin: Path, target: Path, drafter: Path):
    from tests.llama_tools import parse_drafts, run_tool
    from tests.runner.test_patches import F32_CACHES, N_DRAFT, PROMPT

    proc = run_tool(llama_bin, "llama-speculative-simple", "-m", target, "-md", drafter,
                    "--spec-type", "draft-dflash", "--spec-draft-n-max", str(N_DRAFT), "-p", PROMPT,
                    "-n", str(N_DRAFT + 1), "--temp", "0", "-c", "512", "-t", "1", *F32_CACHES, "-lv", "5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    drafts = parse_drafts(proc.stderr)
    assert drafts, proc.stderr[-2000:]
    return drafts[0]


@pytest.mark.integration
def test_mask_embedding_drafts_the_reference_draft(llama_bin, fixtures, published, f32_pair):
    """The first draft equals the z-lab reference's with the mask row replaced by mask_embedding.pt,
    and differs from the reference's with the target's own mask row."""
    from tests.reference_drafts import reference_draft, tokenize
    from tests.runner.test_patches import N_DRAFT, PROMPT

    ids = tokenize(fixtures / "target-hf", PROMPT)
    first = _first_draft(llama_bin, f32_pair["target"], f32_pair["mask-embedding"])
    folder = published / "mask-embedding"
    vector = _mask_vector(folder).float()
    expected = reference_draft(folder, fixtures / "target-hf", ids[:-1], ids[-1], N_DRAFT, mask_embedding=vector)
    assert first.ids == expected
    assert reference_draft(folder, fixtures / "target-hf", ids[:-1], ids[-1], N_DRAFT) != expected


@pytest.mark.integration
def test_sinks_change_the_draft(llama_bin, f32_pair):
    """The sinks are loaded and applied: same weights without them draft otherwise."""
    with_sinks = _first_draft(llama_bin, f32_pair["target"], f32_pair["sinks"])
    without = _first_draft(llama_bin, f32_pair["target"], f32_pair["dflash-b16"])
    assert (with_sinks.pos, with_sinks.id_last) == (without.pos, without.id_last)
    assert with_sinks.ids != without.ids


@pytest.mark.integration
@pytest.mark.parametrize("family", ["sinks", "mimo"])
def test_llama_server_drafts(family, llama_bin, f32_pair, tmp_path):
    from dflash_gguf.runner.server import LlamaServer

    args = ["-md", f32_pair[family], "--spec-type", "draft-dflash", "--parallel", "1", "-c", "512", "-t", "1"]
    with LlamaServer(f32_pair["target"], args, bin_dir=llama_bin, log_path=tmp_path / "server.log") as server:
        answer = server.client.complete("The capital of France is", 24, ignore_eos=True)
    assert answer.n_predicted == 24
    assert answer.draft_n > 0 and 0 <= answer.draft_n_accepted <= answer.draft_n, answer.timings


def test_mask_embedding_is_a_source_file(published):
    """Provenance hashes every file a conversion reads: the own mask embedding is one of them."""
    from dflash_gguf.gguf.checkpoint import Checkpoint
    from dflash_gguf.convert.converter import hash_files

    folder = published / "mask-embedding"
    names = [p.name for p in Checkpoint(folder).source_files()]
    assert names[0] == "config.json" and names[-1] == "mask_embedding.pt"
    assert "mask_embedding.pt" in hash_files(folder, Checkpoint(folder).source_files())
    assert "mask_embedding.pt" not in [p.name for p in Checkpoint(published / "sinks").source_files()]
