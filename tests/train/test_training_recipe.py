"""The SmolLM2 drafters' training recipe (train/recipe.py) on a small random llama target:
a drafter seeded from the target sees exactly the context keys and values of the target layer it
was copied from, and the soft-label and feature terms add to the greedy-token loss only when asked.
Nothing here trains or needs the training cache."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("dflash.model")

from dflash_gguf.train import recipe  # noqa: E402

TAPS = (0, 1)  # the drafter's 2 layers start as target layers 2 and 3


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rope_theta=10000.0, tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(config).eval().requires_grad_(False)


def _shape(config) -> recipe.DrafterShape:
    return recipe.DrafterShape(
        hidden=config.hidden_size, n_head=config.num_attention_heads,
        n_head_kv=config.num_key_value_heads, head_dim=config.head_dim,
        ffn=config.intermediate_size, vocab=config.vocab_size, rope_theta=10000.0,
        rms_eps=config.rms_norm_eps, max_positions=config.max_position_embeddings,
        num_target_layers=config.num_hidden_layers, target_layer_ids=TAPS, mask_token_id=3,
        eos_token_id=2)


def _spec(architecture: str, **extra) -> dict:
    spec = {"architecture": architecture, "num_layers": 2, "block_size": 4, "gamma": 4.0}
    if architecture == "DFlash2DraftModel":
        spec.update(conv_kernel_size=2, conv_group_size=16, selector_rank=4, selector_top_k=2)
    return {**spec, **extra}


def _distill_set(target, rows: int = 3, length: int = 24) -> recipe.DistillSet:
    from dflash.model import extract_context_feature

    torch.manual_seed(1)
    ids = torch.randint(4, target.config.vocab_size, (rows, length))
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    return recipe.DistillSet(
        ids=ids, feats=extract_context_feature(out.hidden_states, list(TAPS))[:, :-1].half(),
        valid_end=torch.full((rows,), length), first_anchor=torch.full((rows,), 4),
        mask_token_id=3, finals=out.hidden_states[-1][:, :-1].half())


@pytest.mark.parametrize("architecture", ["DFlashDraftModel", "DFlash2DraftModel"])
def test_seeded_drafter_sees_the_context_as_the_copied_target_layer(target, architecture):
    config = recipe.drafter_config_dict(_spec(architecture), _shape(target.config))
    drafter = recipe.new_drafter(config, 0)
    data = _distill_set(target)
    recipe.init_from_target(drafter, target, data.feats)
    feats = data.feats.float()
    context = drafter.hidden_norm(drafter.fc(feats))
    deepest = feats[..., (len(TAPS) - 1) * 64:]  # the output of target layer 1, the input of layer 2
    theirs = target.model.layers[2]
    expected = theirs.input_layernorm(deepest)
    torch.testing.assert_close(context, expected, rtol=1e-5, atol=1e-5)
    mine = drafter.layers[0]
    for name in ("k_proj", "v_proj", "q_proj", "o_proj"):
        torch.testing.assert_close(getattr(mine.self_attn, name).weight, getattr(theirs.self_attn, name).weight)
    torch.testing.assert_close(drafter.layers[1].mlp.down_proj.weight, target.model.layers[3].mlp.down_proj.weight)
    torch.testing.assert_close(drafter.norm.weight, target.model.norm.weight)
    # q/k gains: the target layer's typical per-head RMS, so the scores keep its scale
    q = theirs.self_attn.q_proj(expected).view(*expected.shape[:-1], -1, 16)
    assert mine.self_attn.q_norm.weight[0].item() == pytest.approx(float(q.pow(2).mean(-1).sqrt().mean()), rel=1e-4)
    for conv in (mine.attention_conv, mine.mlp_conv):
        if conv is not None:  # DFlash 2's convolutions start as the identity exactly
            assert not conv.kernel_projection.weight.any()


def test_a_target_too_shallow_to_seed_the_drafter_is_refused(target):
    shape = _shape(target.config)
    config = recipe.drafter_config_dict(_spec("DFlashDraftModel"), shape)
    config["dflash_config"]["target_layer_ids"] = [0, 2]  # layers 3 and 4: the target has 4
    drafter = recipe.new_drafter(config, 0)
    with pytest.raises(ValueError, match="cannot seed 2 drafter layers"):
        recipe.init_from_target(drafter, target, torch.zeros(1, 1, 128))


@pytest.mark.parametrize("architecture", ["DFlashDraftModel", "DFlash2DraftModel"])
def test_soft_labels_and_feature_loss_add_to_the_greedy_loss_only_when_asked(target, architecture):
    data = _distill_set(target)
    config = recipe.drafter_config_dict(_spec(architecture), _shape(target.config))
    drafter = recipe.new_drafter(config, 0)
    recipe.init_from_target(drafter, target, data.feats)
    seq, anchors = recipe.anchor_batch(data, 2, 3, torch.Generator().manual_seed(0))

    def loss(**extra):
        with torch.no_grad():
            return recipe.drafter_loss(drafter, target, data, seq, anchors, _spec(architecture, **extra))

    plain, plain_stats = loss()
    off, _ = loss(soft_labels=0.0, feature_loss=0.0)
    soft, soft_stats = loss(soft_labels=0.5)
    feature, _ = loss(feature_loss=1.0)
    both, _ = loss(soft_labels=0.5, feature_loss=1.0)
    assert torch.equal(plain, off)
    assert torch.isfinite(soft) and soft != plain
    # the feature term is a non-negative distance, here not zero
    assert feature > plain and both > soft
    assert soft_stats["acc"] == plain_stats["acc"]  # the argmax statistics are the greedy ones


def test_soft_labels_without_the_targets_final_states_are_refused(target):
    data = _distill_set(target)
    data.finals = None
    config = recipe.drafter_config_dict(_spec("DFlashDraftModel"), _shape(target.config))
    drafter = recipe.new_drafter(config, 0)
    seq, anchors = recipe.anchor_batch(data, 1, 2, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="DistillSet.finals"):
        recipe.drafter_loss(drafter, target, data, seq, anchors, _spec("DFlashDraftModel", soft_labels=0.5))


def _with_teacher(target, data: recipe.DistillSet, k: int) -> recipe.DistillSet:
    data.teacher_ids, data.teacher_logp = recipe.teacher_top_k(
        data.finals, target.lm_head, data.first_anchor, data.valid_end - 1, k)
    return data


def test_teacher_top_k_is_the_heads_top_k_where_labels_are_read(target):
    data = _distill_set(target)
    ids, logp = recipe.teacher_top_k(data.finals, target.lm_head, data.first_anchor, data.valid_end - 1, 5)
    full = torch.log_softmax(target.lm_head(data.finals[1, 10].float()), -1)
    assert ids[1, 10].tolist() == full.topk(5).indices.tolist()
    torch.testing.assert_close(logp[1, 10].float(), full.topk(5).values, rtol=1e-2, atol=1e-2)
    assert not ids[:, :4].any() and not logp[:, :4].any()  # before the first anchor: not computed


@pytest.mark.parametrize("architecture", ["DFlashDraftModel", "DFlash2DraftModel"])
def test_sampled_softmax_over_the_whole_vocabulary_is_the_full_loss(target, architecture):
    # the teacher's top-k = every token: no negative is drawn and the subset is the vocabulary
    data = _with_teacher(target, _distill_set(target), target.config.vocab_size)
    config = recipe.drafter_config_dict(_spec(architecture), _shape(target.config))
    drafter = recipe.new_drafter(config, 0)
    recipe.init_from_target(drafter, target, data.feats)
    seq, anchors = recipe.anchor_batch(data, 2, 3, torch.Generator().manual_seed(0))
    extra = {"soft_labels": 0.5, "feature_loss": 1.0}
    with torch.no_grad():
        full, full_stats = recipe.drafter_loss(drafter, target, data, seq, anchors, _spec(architecture, **extra))
        sampled, sampled_stats = recipe.drafter_loss(
            drafter, target, data, seq, anchors, _spec(architecture, sampled_softmax=64, **extra),
            torch.Generator().manual_seed(1))
    # the soft labels differ only by the half-precision teacher log-probs
    torch.testing.assert_close(sampled, full, rtol=2e-3, atol=2e-3)
    assert sampled_stats["acc"] == full_stats["acc"] and sampled_stats["accept"] == full_stats["accept"]
    if architecture == "DFlash2DraftModel":
        assert sampled_stats["sel_acc"] == full_stats["sel_acc"]


def test_sampled_softmax_reads_few_head_rows_and_keeps_the_loss_near(target):
    data = _with_teacher(target, _distill_set(target), 8)
    config = recipe.drafter_config_dict(_spec("DFlashDraftModel"), _shape(target.config))
    drafter = recipe.new_drafter(config, 0)
    recipe.init_from_target(drafter, target, data.feats)
    seq, anchors = recipe.anchor_batch(data, 1, 2, torch.Generator().manual_seed(0))
    rows = []
    original = recipe.subset_logits

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        rows.append(len(out[2]))
        return out

    # greedy-token loss only: a random target's top-8 holds too little of its mass to compare soft labels
    spec = _spec("DFlashDraftModel", sampled_softmax=32)
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(recipe, "subset_logits", spy)
        sampled, _ = recipe.drafter_loss(drafter, target, data, seq, anchors, spec, torch.Generator().manual_seed(1))
        full, _ = recipe.drafter_loss(drafter, target, data, seq, anchors, _spec("DFlashDraftModel"))
    assert rows and rows[0] < target.config.vocab_size * 0.6
    assert abs(sampled.item() - full.item()) < 0.1 * full.item()


def test_sampled_softmax_without_the_targets_top_k_is_refused(target):
    data = _distill_set(target)
    config = recipe.drafter_config_dict(_spec("DFlashDraftModel"), _shape(target.config))
    drafter = recipe.new_drafter(config, 0)
    seq, anchors = recipe.anchor_batch(data, 1, 2, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="DistillSet.teacher_ids"):
        recipe.drafter_loss(drafter, target, data, seq, anchors, _spec("DFlashDraftModel", sampled_softmax=8))


def test_a_timed_run_is_resized_from_the_pace_of_its_last_steps():
    from collections import deque

    from dflash_gguf.train.recipe import _sized

    # 600 s budget, 300 s spent; the last 25 steps took 1 s each (the first took 0.2 s: load came)
    assert _sized(600.0, 300.0, 500, deque([(100.0, 475), (125.0, 500)])) == 800
    # the load went away: 0.25 s a step now, 300 s left -> 1,200 more steps, not the warm-up's few
    assert _sized(600.0, 300.0, 500, deque([(100.0, 400), (125.0, 500)])) == 1700
    # over budget: one more step (the loop then ends), never fewer than done
    assert _sized(600.0, 700.0, 500, deque([(100.0, 475), (125.0, 500)])) == 501
