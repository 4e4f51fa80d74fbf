"""The committed trained pair (tests/fixtures/trained, made by `make train-pair`): it loads with
transformers and the z-lab reference classes, keeps the z-lab layout, reproduces the target's
recorded greedy tokens, and its drafters are lossless and actually accepted (the DSpark one with
the project's own PyTorch DSpark, z-lab having none). Nothing here trains."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from dflash_gguf.gguf.hf_vocab import QWEN2_SPLIT_REGEX
from safetensors import safe_open

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
reference = pytest.importorskip("dflash.model")

TRAINED = Path(__file__).resolve().parents[1] / "fixtures" / "trained"
DRAFTERS = {"dflash": reference.DFlashDraftModel, "dflash2": reference.DFlash2DraftModel}


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _tensor_names(folder: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    with safe_open(folder / "model.safetensors", "pt") as f:
        return {name: (str(f.get_slice(name).get_dtype()), tuple(f.get_slice(name).get_shape()))
                for name in f.keys()}


@pytest.fixture(scope="module")
def target():
    model = transformers.Qwen3ForCausalLM.from_pretrained(TRAINED / "target", dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def greedy() -> dict:
    return _json(TRAINED / "greedy.json")


def test_target_folder_is_a_qwen3_checkpoint_with_its_tokenizer():
    files = {p.name for p in (TRAINED / "target").iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= files
    config = _json(TRAINED / "target" / "config.json")
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["model_type"] == "qwen3"
    tokenizer = _json(TRAINED / "target" / "tokenizer.json")
    # What llama.cpp's `qwen2` pre-tokenizer implements: the Qwen2 split, then byte-level.
    split, byte_level = tokenizer["pre_tokenizer"]["pretokenizers"]
    assert split["type"] == "Split" and split["pattern"]["Regex"] == QWEN2_SPLIT_REGEX
    assert split["behavior"] == "Isolated"
    assert byte_level["type"] == "ByteLevel" and byte_level["use_regex"] is False
    assert byte_level["add_prefix_space"] is False
    assert tokenizer["decoder"]["type"] == "ByteLevel"
    assert tokenizer["post_processor"]["type"] == "ByteLevel"
    assert tokenizer["model"]["type"] == "BPE"
    n_tokens = len(tokenizer["model"]["vocab"]) + len(tokenizer["added_tokens"])
    assert n_tokens < config["vocab_size"]  # spare rows: where the mask token lives
    eos = next(t for t in tokenizer["added_tokens"] if t["content"] == "<|endoftext|>")
    assert config["eos_token_id"] == eos["id"]
    # Every weight bf16, embeddings tied (no lm_head tensor).
    names = _tensor_names(TRAINED / "target")
    assert "lm_head.weight" not in names and config["tie_word_embeddings"] is True
    assert {dtype for dtype, _ in names.values()} == {"BF16"}


def test_target_reproduces_the_recorded_greedy_tokens(target, greedy):
    tokenizer = transformers.AutoTokenizer.from_pretrained(TRAINED / "target")
    for record in greedy["records"]:
        assert tokenizer.encode(record["prompt_text"]) == record["prompt_ids"]
        with torch.inference_mode():
            out = target.generate(torch.tensor([record["prompt_ids"]]), do_sample=False,
                                  max_new_tokens=greedy["new_tokens"])
        assert out[0, len(record["prompt_ids"]):].tolist() == record["greedy_ids"], record["source"]


@pytest.mark.parametrize("name", DRAFTERS)
def test_drafter_folder_has_the_z_lab_layout(name):
    folder = TRAINED / name
    assert {p.name for p in folder.iterdir()} == {"config.json", "model.safetensors"}
    config = _json(folder / "config.json")
    target = _json(TRAINED / "target" / "config.json")
    settings = config["dflash_config"]
    assert config["architectures"] == [DRAFTERS[name].__name__]
    assert config["hidden_size"] == target["hidden_size"]
    assert config["vocab_size"] == target["vocab_size"]
    assert config["num_target_layers"] == target["num_hidden_layers"]
    assert max(settings["target_layer_ids"]) < target["num_hidden_layers"] - 1
    tokenizer = _json(TRAINED / "target" / "tokenizer.json")
    named_ids = set(tokenizer["model"]["vocab"].values()) | {t["id"] for t in tokenizer["added_tokens"]}
    assert settings["mask_token_id"] < target["vocab_size"] and settings["mask_token_id"] not in named_ids
    names = _tensor_names(folder)
    assert not any("embed_tokens" in n or "lm_head" in n for n in names)  # borrowed from the target
    assert names["fc.weight"][1] == (config["hidden_size"],
                                     len(settings["target_layer_ids"]) * config["hidden_size"])
    assert {"hidden_norm.weight", "norm.weight"} <= set(names)
    if name == "dflash2":
        k = settings["selector_top_k"]
        assert config["hidden_size"] % settings["conv_group_size"] == 0  # llama.cpp's loader
        assert config["hidden_size"] >= k * (k + 1)
        # z-lab ships the codebooks without `.weight`; llama.cpp's converter expects that.
        assert "candidate_selector.predecessor_codebook" in names
        assert "candidate_selector.successor_codebook" in names
        assert "candidate_selector.hidden_projection.weight" in names
        assert "layers.0.attention_conv.base_kernel" in names
    else:
        assert not any("conv" in n or "selector" in n for n in names)


@pytest.mark.parametrize("name", DRAFTERS)
def test_drafter_loads_with_the_reference_class(name):
    model, info = DRAFTERS[name].from_pretrained(TRAINED / name, output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("name", DRAFTERS)
def test_drafter_is_lossless_and_accepted(name, target, greedy, monkeypatch):
    # dflash_generate's statistics time with torch.cuda.synchronize; a plain clock on CPU.
    monkeypatch.setattr(reference, "_cuda_time", time.perf_counter)
    drafter = DRAFTERS[name].from_pretrained(TRAINED / name, dtype=torch.float32).eval()
    record = greedy["records"][0]
    stats = reference.dflash_generate(drafter, target, torch.tensor([record["prompt_ids"]]),
                                      max_new_tokens=greedy["new_tokens"], stop_token_ids=None,
                                      temperature=0.0, return_stats=True)
    produced = stats.output_ids[0, len(record["prompt_ids"]):].tolist()
    assert produced[: len(record["greedy_ids"])] == record["greedy_ids"]
    tau = sum(stats.acceptance_lengths) / len(stats.acceptance_lengths)
    assert tau > 1.5, f"{name} drafts are hardly ever accepted (tau {tau:.2f})"


def test_dspark_folder_has_the_lineage_layout():
    """DSpark's DFlash-lineage schema (deepseek-ai/dspark_qwen3_4b_block7): the settings at the top
    level, no dflash_config; the Markov head and the confidence head beside the DFlash layers."""
    folder = TRAINED / "dspark"
    assert {p.name for p in folder.iterdir()} == {"config.json", "model.safetensors"}
    config = _json(folder / "config.json")
    target = _json(TRAINED / "target" / "config.json")
    assert config["architectures"] == ["DSparkDraftModel"] and "dflash_config" not in config
    assert (config["block_size"], config["markov_head_type"], config["has_confidence_head"]) == (7, "vanilla", True)
    assert max(config["target_layer_ids"]) < target["num_hidden_layers"] - 1
    names = _tensor_names(folder)
    vocab, hidden, rank = target["vocab_size"], target["hidden_size"], config["markov_rank"]
    assert names["markov_head.markov_w1.weight"][1] == (vocab, rank)
    assert names["markov_head.markov_w2.weight"][1] == (vocab, rank)
    assert names["confidence_head.proj.weight"][1] == (1, hidden + rank)
    assert names["confidence_head.proj.bias"][1] == (1,)
    assert not any("embed_tokens" in n or "lm_head" in n for n in names)  # full vocabulary: the target's


def test_dspark_loads_and_is_lossless_and_accepted(target, greedy):
    from dflash_gguf.validation.dspark_reference import DSparkDraftModel, dspark_generate

    model, info = DSparkDraftModel.from_pretrained(TRAINED / "dspark", output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    drafter = DSparkDraftModel.from_pretrained(TRAINED / "dspark", dtype=torch.float32).eval()
    record = greedy["records"][0]
    stats = dspark_generate(drafter, target, torch.tensor([record["prompt_ids"]]), greedy["new_tokens"], None)
    produced = stats.output_ids[0, len(record["prompt_ids"]):].tolist()
    assert produced[: len(record["greedy_ids"])] == record["greedy_ids"]
    tau = sum(stats.acceptance_lengths) / len(stats.acceptance_lengths)
    assert tau > 1.5, f"dspark drafts are hardly ever accepted (tau {tau:.2f})"
