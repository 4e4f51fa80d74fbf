"""The z-lab reference on a DeepSeek-V4 target (the zoo's deepseek4): it reads the layer inputs the pinned
llama.cpp records for the drafter (the mean of the hyper-connection streams, not transformers' 4-D
streams), generates through a target whose transformers cache cannot be rolled back, and drafts every
block llama.cpp drafted (validation/reference_target.py). Before it: "RuntimeError: Tensors must have
same number of dimensions: got 4 and 3", then a failed verify after the first crop."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import dflash_gguf

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("dflash.model")

from dflash_gguf.validation import reference  # noqa: E402  (after the skips: needs the reference extra)

pytestmark = pytest.mark.torch

# chat-templated "Write a short poem about the sea." as the zoo's drafters were trained on it
PROMPT = [151644, 872, 198, 7985, 264, 2805, 32794, 911, 279, 9396, 13, 151645, 198, 151644, 77091, 198]
N = 24


def _greedy(target, ids: list[int], n: int) -> list[int]:
    ids = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(target(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[-n:]


@pytest.mark.integration
def test_the_reference_reads_what_llama_cpp_records(family, llama_bin):
    """Every layer input llama.cpp records (0..n_layer, n_layer being the last layer's output) is
    transformers' hidden state at that index as the reference reads it: one row of n_embd per token, equal
    up to the F16 weights' rounding (the alternatives are far: stream 0 alone differs by >= 1, the tied
    last hidden state by 6.6)."""
    np = pytest.importorskip("numpy")
    from dflash_gguf.train.teacher import Teacher

    folder = family("deepseek4")
    target = reference.load_target(folder / "hf", torch.float32)
    layers = target.config.num_hidden_layers
    with torch.inference_mode():
        states = target(torch.tensor([PROMPT]), output_hidden_states=True).hidden_states
    with Teacher(folder / "target-F16.gguf", list(range(layers + 1)), n_ctx=64, n_seq=1, top_k=4, threads=1,
                 bin_dir=llama_bin) as teacher:
        taps = teacher.answer([PROMPT], 1)[0].taps.astype(np.float32)
    hidden = target.config.hidden_size
    taps = taps.reshape(len(PROMPT), layers + 1, hidden)
    assert [tuple(h.shape) for h in states] == [(1, len(PROMPT), hidden)] * (layers + 1)
    for lid, state in enumerate(states):
        assert np.abs(state[0].numpy() - taps[:, lid]).max() < 0.1, f"layer input {lid}"


def test_the_reference_generates_as_the_target_alone(family, tmp_path, monkeypatch):
    """Greedy speculative decoding is lossless: the reference's tokens are the target's own greedy
    answer, with blocks accepted (the drafter is trained), although every verify rejects some tokens."""
    monkeypatch.setenv("DFLASH_GGUF_CACHE", str(tmp_path / "cache"))
    folder = family("deepseek4")
    (run,) = reference.run_reference(folder / "dflash-hf", folder / "hf", [PROMPT], N)
    assert run.tokens == _greedy(reference.load_target(folder / "hf", torch.float32), PROMPT, N)
    assert run.tau > 1.5


@pytest.mark.integration
@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_draft_parity_on_deepseek4(variant, family, llama_bin, tmp_path):
    """`validate --reference-*` measures DeepSeek-V4 draft parity: every block llama.cpp drafted is the
    reference's (none differs beyond the F16 noise), and the reference accepts what llama.cpp does."""
    folder = family("deepseek4")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join((folder / "prompts.jsonl").read_text().splitlines(keepends=True)[:2]))
    out = tmp_path / "report.json"
    proc = dflash_gguf("validate", "--target", folder / "target-F16.gguf", "--draft", folder / f"{variant}.gguf",
                       "--prompts", prompts, "-n", str(N), "--threads", "1", "--rounds", "0",
                       "--llama-bin", llama_bin, "--reference-draft", folder / f"{variant}-hf",
                       "--reference-target", folder / "hf", "--report", out,
                       env={**os.environ, "DFLASH_GGUF_CACHE": str(tmp_path / "cache")})  # no kept reference run
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    parity = report["reference"]["draft_parity"]
    assert parity["steps"] > 0 and parity["systematic"] == 0 and parity["first_position_equal"] >= 0.95, parity
    assert report["reference"]["mean_acceptance_length"] == pytest.approx(report["mean_acceptance_length"], abs=0.05)
    # --rounds 0: the proof only, no speed servers started
    assert report["speed"]["speedup_unreliable"] == "not measured (rounds 0)" and report["speed"]["server_pairs"] == 0
