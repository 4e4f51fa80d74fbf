"""SmolLM2-135M-Instruct as a fixture (training/fixtures/smollm2.py): the pinned bytes from PyPI's
wheel, its requantizations by the patched llama-quantize, the HF folder derived from it
(training/hf_from_gguf.py) proved by the pinned upstream converter and by llama.cpp's logits, and
the drafters trained for it loading and drafting in the patched llama-server."""

from __future__ import annotations

import json

import pytest

from dflash_gguf.gguf.reader import GGUFFile
from dflash_gguf.hashing import sha256_file
from training.fixtures import smollm2 as fixture

# general.file_type of each target (llama_ftype)
FILE_TYPES = {"Q4_1": 3, "F16": 1, "Q8_0": 7, "Q4_K_M": 15}


def _tokenizer_kv(gguf: GGUFFile) -> dict[str, bytes]:
    return {key: kv.encoded() for key, kv in gguf.kv.items() if key.startswith("tokenizer.")}


def _held_out_ids(count: int) -> list[list[int]]:
    from training.train_smollm2 import eval_prompt_ids

    return eval_prompt_ids()[:count]


def test_the_wheel_and_its_gguf_are_the_pinned_bytes():
    gguf = fixture.shipped_gguf()
    assert gguf.stat().st_size == fixture.GGUF_SIZE
    assert sha256_file(gguf) == fixture.GGUF_SHA256
    wheel = gguf.parent / "wheel" / fixture.WHEEL
    assert wheel.stat().st_size == fixture.WHEEL_SIZE
    assert sha256_file(wheel) == fixture.WHEEL_SHA256


@pytest.mark.integration
def test_targets_are_the_shipped_file_and_its_requantizations(smollm2):
    assert sha256_file(smollm2["Q4_1"]) == fixture.GGUF_SHA256
    shipped = None
    for name, file_type in FILE_TYPES.items():
        assert smollm2[name].name == f"target-{name}.gguf"
        with GGUFFile(smollm2[name]) as gguf:
            assert gguf.architecture == "llama"
            assert gguf.get("general.file_type") == file_type, name
            assert gguf.get("llama.block_count") == 30
            tokenizer = _tokenizer_kv(gguf)
        shipped = shipped or tokenizer
        assert len(tokenizer["tokenizer.ggml.tokens"]) > 49152  # the vocabulary, not an empty key
        assert tokenizer == shipped, name  # requantizing keeps the tokenizer


def test_derived_folder_describes_the_gguf():
    folder = fixture.hf_target()
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["intermediate_size"], config["vocab_size"]) == \
        (576, 30, 9, 3, 1536, 49152)
    assert (config["rms_norm_eps"], config["rope_theta"], config["tie_word_embeddings"]) == (1e-5, 100000.0, True)
    with GGUFFile(fixture.shipped_gguf()) as gguf:
        template = gguf.get("tokenizer.chat_template")
    assert json.loads((folder / "tokenizer_config.json").read_text())["chat_template"] == template


@pytest.mark.upstream
def test_upstream_converter_turns_the_derived_folder_back_into_the_target(smollm2, tmp_path):
    """The pinned convert_hf_to_gguf.py recognises the rebuilt tokenizer as `smollm` (by the hash
    of its token ids), writes the shipped tokenizer metadata (plus add_eos_token = false, which
    today's converter writes for every byte-level BPE and the 2024 one that made the shipped file
    did not), and the weights byte for byte as llama-quantize's F16 of the shipped file: the
    derivation (dequantization, q/k order) is exact."""
    from training.fixtures.upstream import run_upstream_converter

    out = run_upstream_converter(fixture.hf_target(), tmp_path / "upstream-f16.gguf", "f16")
    with GGUFFile(out) as ours, GGUFFile(fixture.shipped_gguf()) as shipped:
        written, expected = _tokenizer_kv(ours), _tokenizer_kv(shipped)
        assert ours.get("tokenizer.ggml.add_eos_token") is False
    del written["tokenizer.ggml.add_eos_token"]
    assert written == expected
    with GGUFFile(out) as ours, GGUFFile(smollm2["F16"]) as theirs:
        assert sorted(ours.tensors) == sorted(theirs.tensors)
        for name, info in theirs.tensors.items():
            assert (ours.tensors[name].shape, ours.tensors[name].type) == (info.shape, info.type), name
            assert ours.tensor_bytes(name) == theirs.tensor_bytes(name), name


@pytest.mark.integration
def test_derived_tokenizer_encodes_as_llama_cpp(smollm2):
    """The rebuilt tokenizer.json splits text as llama.cpp's `smollm` pre-tokenizer does."""
    from transformers import AutoTokenizer

    from dflash_gguf.runner.bindings import load_model

    tokenizer = AutoTokenizer.from_pretrained(fixture.hf_target())
    texts = ["Hello world! 1234567 apples, café ÷ ünïcödé 🤖",
             "def f(xs):\n    return [x * x for x in xs if x % 2 == 0]\n\n\n\tdone  ",
             "<|im_start|>user\nWhat's 2+2?<|im_end|>\n<|im_start|>assistant\n"]
    llm = load_model(smollm2["Q4_1"], backend="cpu", n_ctx=256, vocab_only=True)
    try:
        for text in texts:
            assert tokenizer.encode(text) == llm.tokenize(text.encode(), add_bos=False, special=True), text
    finally:
        llm.close()


@pytest.mark.integration
def test_derived_model_agrees_with_llama_cpp(smollm2):
    """transformers (float32) on the derived folder and llama.cpp on the F16 target predict the same
    next token at nearly every position of three held-out answers (training/hf_fidelity.py)."""
    import torch

    from training.hf_fidelity import compare, hf_answers

    torch.set_num_threads(1)
    prompts = _held_out_ids(3)
    answers, logits = hf_answers(prompts, 24)
    report = compare(prompts, answers, logits, {"F16": smollm2["F16"]})["F16"]
    assert report["top1_agreement"] >= 0.95, report
    assert report["mean_abs_logit_diff"] < 0.1, report


@pytest.mark.integration
@pytest.mark.parametrize("drafter", fixture.DRAFTERS)
def test_trained_drafter_drafts_in_the_patched_server(drafter, smollm2):
    """Each committed drafter, converted against the target, loads in llama-server, drafts on a
    held-out prompt, and leaves the F16 target's greedy answer unchanged. (Its acceptance is low:
    tau 1.6-1.9, what 90 minutes of `train` on 2 cores gave, docs/train.md; reference_tau.json has the figures.)"""
    from dflash_gguf.runner.launch import speculative_args
    from dflash_gguf.runner.server import LlamaServer

    prompt = _held_out_ids(1)[0]
    args = ["-t", "1", "-c", "1024", "--no-warmup"]
    with LlamaServer(smollm2["F16"], args) as server:
        plain = server.client.complete(prompt, 32, temperature=0.0, cache_prompt=False)
    with LlamaServer(smollm2["F16"], [*args, *speculative_args(smollm2[drafter])]) as server:
        drafted = server.client.complete(prompt, 32, temperature=0.0, cache_prompt=False)
    assert drafted.tokens == plain.tokens
    assert drafted.draft_n > 0


@pytest.mark.torch  # training.train_smollm2 tokenizes with transformers
def test_reference_tau_records_the_token_ids_it_was_measured_on():
    record = json.loads(fixture.REFERENCE_TAU.read_text())
    assert record["prompt_ids"] == _held_out_ids(24)
    for name in fixture.DRAFTERS:
        entry = record["drafters"][name]
        assert len(entry["per_prompt"]) == len(entry["output_ids"]) == 24
        assert entry["tokens"] == sum(map(sum, entry["acceptance_lengths"]))
        assert entry["tau"] == pytest.approx(entry["tokens"] / entry["steps"], abs=1e-3)


def test_the_fine_tunes_style_is_a_rewrite_outside_code():
    from training.fixtures.smollm2_finetune import piratise

    text = "Yes, the answer is here.\n```python\nx = 1 if y is None else 2\n```\nAnd you are my friend."
    assert piratise(text) == ("Arr! Aye, th' answer be here.\n```python\nx = 1 if y is None else 2\n```\n"
                              "An' ye be me matey.")


@pytest.mark.integration
def test_the_fine_tune_answers_in_its_style_and_keeps_the_tokenizer(smollm2, smollm2_finetune):
    """The fine-tune (the original's last layers taught a pirate's style) is a SmolLM2 the converter
    and llama.cpp take as they take the original: the same vocabulary and chat template, a different
    greedy answer that starts as the style set taught it."""
    from dflash_gguf.runner.server import LlamaServer

    with GGUFFile(smollm2["Q4_K_M"]) as original, GGUFFile(smollm2_finetune["Q4_K_M"]) as tuned:
        assert tuned.architecture == "llama" and tuned.get("general.file_type") == FILE_TYPES["Q4_K_M"]
        vocabulary = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                      "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.chat_template")
        assert [tuned.kv[k].encoded() for k in vocabulary] == [original.kv[k].encoded() for k in vocabulary]
    prompt = _held_out_ids(1)[0]
    answers = {}
    for name, path in (("original", smollm2["Q4_K_M"]), ("tuned", smollm2_finetune["Q4_K_M"])):
        with LlamaServer(path, ["-t", "1", "-c", "1024", "--no-warmup"]) as server:
            answers[name] = server.client.complete(prompt, 16, temperature=0.0, cache_prompt=False)
    assert answers["tuned"].content.startswith("Arr!"), answers["tuned"].content
    assert not answers["original"].content.startswith("Arr!")
