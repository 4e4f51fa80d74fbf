"""The reader's tensor data (dflash_gguf/gguf/reader.py: tensor_rows, tensor_span), what train reads its
target through and convert copies and patches a target's embeddings from, against gguf-py's own reader:
an independent reading of the same bytes, here on purpose."""

from __future__ import annotations

import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize, quantize

from dflash_gguf.errors import GGUFFormatError
from dflash_gguf.gguf.format import KV, TensorInfo
from dflash_gguf.gguf.keys import General, Model, Tokenizer, per_arch
from dflash_gguf.gguf.reader import GGUFFile
from dflash_gguf.gguf.writer import GGUFPlan, PlannedTensor, write_gguf


ARCH, N_EMBD, N_HEAD, N_VOCAB = "llama", 64, 2, 7


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A tiny llama target holding the tensor types targets carry (F32 in 1 and 3 dimensions, F16,
    BF16, Q8_0)."""
    rng = np.random.default_rng(0)
    values = {"a.f32": (QT.F32, rng.standard_normal((3, 5, 8), dtype=np.float32)),
              "output_norm.weight": (QT.F32, rng.standard_normal(N_EMBD, dtype=np.float32)),
              "blk.0.attn_q.weight": (QT.F16, rng.standard_normal((N_EMBD, N_EMBD), dtype=np.float32)),
              "blk.0.attn_k.weight": (QT.BF16, rng.standard_normal((N_EMBD, N_EMBD), dtype=np.float32)),
              "token_embd.weight": (QT.Q8_0, rng.standard_normal((N_VOCAB, N_EMBD), dtype=np.float32))}
    key = lambda template: per_arch(template, ARCH)  # noqa: E731
    u32 = GGUFValueType.UINT32
    plan = GGUFPlan(kv=[KV(General.ARCHITECTURE, GGUFValueType.STRING, ARCH),
                        KV(key(Model.EMBEDDING_LENGTH), u32, N_EMBD), KV(key(Model.BLOCK_COUNT), u32, 1),
                        KV(key(Model.HEAD_COUNT), u32, N_HEAD), KV(key(Model.FEED_FORWARD_LENGTH), u32, 128),
                        KV(Tokenizer.TOKENS, GGUFValueType.ARRAY, [f"t{i}" for i in range(N_VOCAB)],
                           GGUFValueType.STRING)])
    for name, (qtype, data) in values.items():
        stored = quantize(data, qtype)
        plan.tensors.append(PlannedTensor(TensorInfo(name, data.shape, qtype), lambda b=stored.tobytes(): [b]))
    path = tmp_path_factory.mktemp("reader") / "t.gguf"
    write_gguf(plan, path)
    return path


def test_tensor_rows_hold_what_gguf_py_reads(written):
    theirs = {t.name: t for t in GGUFReader(str(written)).tensors}
    with GGUFFile(written) as f:
        assert sorted(f.tensors) == sorted(theirs)
        for name, info in f.tensors.items():
            rows = f.tensor_rows(name)
            assert rows.tobytes() == theirs[name].data.tobytes(), name
            ours = dequantize(rows, info.type).reshape(info.shape)
            expected = dequantize(theirs[name].data, info.type).reshape(info.shape)
            assert ours.dtype == np.float32 and np.array_equal(ours, expected), name


def test_tensor_rows_reads_the_rows_asked_for(written):
    with GGUFFile(written) as f:
        whole = f.tensor_rows("token_embd.weight")
        assert whole.shape == (N_VOCAB, N_EMBD // 32 * 34)
        assert np.array_equal(f.tensor_rows("token_embd.weight", 2, 3), whole[2:5])
        assert f.tensor_rows("a.f32").shape == (15, 32)  # outer dimensions taken together
        with pytest.raises(ValueError):
            f.tensor_rows("token_embd.weight", 5, 3)


def test_tensor_span_names_the_bytes_of_the_file_as_opened(written):
    theirs = {t.name: t for t in GGUFReader(str(written)).tensors}
    with GGUFFile(written) as f:
        for name, tensor in theirs.items():
            span = f.tensor_span(name)
            assert (span.offset, span.nbytes) == (tensor.data_offset, tensor.n_bytes), name
            assert os.pread(span.source.fileno(), span.nbytes, span.offset) == tensor.data.tobytes(), name


def test_a_file_cut_short_since_it_was_opened_is_refused(written, tmp_path):
    copy = tmp_path / "cut.gguf"
    copy.write_bytes(written.read_bytes())
    with GGUFFile(copy) as f:
        os.truncate(copy, f.tensor_span("token_embd.weight").offset + 10)
        with pytest.raises(GGUFFormatError, match=r"cut\.gguf: tensor 'token_embd\.weight' is cut short at byte \d+"):
            f.tensor_rows("token_embd.weight")


@pytest.mark.torch
def test_train_reads_its_target_as_it_did_through_gguf_py(written):
    """train/frozen.py's tensors, read by our reader, against its former reading through gguf-py's
    GGUFReader (dequantized, put in numpy order, q/k rows unpermuted for llama)."""
    torch = pytest.importorskip("torch")  # extra: torch
    from dflash_gguf.train.frozen import GGUFWeights, _unpermute  # extra: torch

    weights = GGUFWeights(written)
    assert (weights.shape.n_embd, weights.shape.n_head, weights.shape.n_head_kv, weights.shape.n_vocab) == \
        (N_EMBD, N_HEAD, N_HEAD, N_VOCAB)
    for tensor in GGUFReader(str(written)).tensors:
        before = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        before = before.reshape([int(n) for n in reversed(tensor.shape.tolist())])
        if tensor.name.endswith(("attn_q.weight", "attn_k.weight")):
            before = _unpermute(before, N_HEAD)
        assert torch.equal(weights.get(tensor.name), torch.from_numpy(np.ascontiguousarray(before))), tensor.name
