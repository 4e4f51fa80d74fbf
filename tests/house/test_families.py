"""The target-family zoo (training/fixtures/families.py), family by family: the pinned upstream converter
writes each tiny target with its family's architecture and the keys its drafters depend on;
dflash-gguf converts the family's DFlash and DFlash 2 drafters against it with the published
geometry; the patched llama-server serves each pair losslessly; `doctor` finds nothing on a healthy
pair and names each family's own failure causes when they are injected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf import GGUFValueType

from dflash_gguf.gguf.format import KV
from dflash_gguf.gguf.keys import DFlash
from dflash_gguf.gguf.reader import GGUFFile
from dflash_gguf.families import RECORDS_LAST_OUTPUT, TARGET_KEYS, UNSERVED
from tests.conftest import dflash_gguf
from training.fixtures.family_drafters import VARIANTS, geometry
from training.fixtures.gguf_edit import edited_copy
from training.fixtures.toys import FAMILIES

ARCHS = sorted(FAMILIES)


@pytest.mark.upstream
@pytest.mark.parametrize("arch", ARCHS)
def test_every_family_converts_to_its_own_architecture(arch):
    """The zoo builds and converts every family (the `family` fixture skips one that does not): the
    pinned converter with ggml_patches/0011 writes a dense Nemotron-H saved by transformers 5 as
    nemotron_h (not nemotron_h_moe, which records no layer inputs) and reads DeepSeek-V4 as
    transformers saves it (without the patch: KeyError: 'num_hash_layers')."""
    from training.fixtures.families import STATUS, family_folder

    assert not FAMILIES[arch].limitation, FAMILIES[arch].limitation
    status = json.loads((family_folder(arch) / STATUS).read_text())
    assert (status["hf"], status.get("F16")) == ("built", "converted"), status


@pytest.mark.upstream
@pytest.mark.parametrize("arch", ARCHS)
def test_target_carries_its_family_geometry(arch, family):
    fam = FAMILIES[arch]
    with GGUFFile(family(arch) / "target-F16.gguf") as target:
        assert target.architecture == arch
        assert target.get(f"{arch}.block_count") == fam.num_layers
        assert target.get(f"{arch}.embedding_length") == fam.toy["hidden_size"]
        missing = [key for key in fam.target_keys if target.get(f"{arch}.{key}") is None]
    assert not missing, f"{arch} target lacks {missing}"


@pytest.mark.integration
@pytest.mark.parametrize("arch", ARCHS)
def test_target_quantizes_to_q4_k_m(arch, family, llama_bin):
    folder = family(arch)
    status = json.loads((folder / "status.json").read_text())
    assert status["Q4_K_M"] == "quantized", status["Q4_K_M"]
    with GGUFFile(folder / "target-Q4_K_M.gguf") as target:
        assert target.architecture == arch
        assert target.get("general.file_type") == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M


@pytest.mark.upstream
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("arch", ARCHS)
def test_drafter_converts_with_published_geometry(arch, variant, family):
    folder = family(arch)
    status = json.loads((folder / "status.json").read_text())
    assert status[variant] == "converted", status[variant]
    fam, geo = FAMILIES[arch], geometry(FAMILIES[arch], variant)
    with GGUFFile(folder / f"{variant}.gguf") as drafter:
        assert drafter.get(DFlash.BLOCK_SIZE) == geo.block_size
        assert list(drafter.get(DFlash.TARGET_LAYERS)) == [i + 1 for i in fam.tapped_layers(geo.num_layers)]
        assert (drafter.get(DFlash.CONV_KERNEL_SIZE) is not None) == (variant == "dflash2")


@pytest.mark.integration
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("arch", ARCHS)
def test_pair_is_exact_in_patched_server(arch, variant, family, llama_bin, tmp_path):
    """Under --exact the speculative output is the target's own, and every emitted token is proven by
    replay, on recurrent and sliding-window targets too (steps llama-server rolled back through a
    checkpoint are replayed from the same restored state), with the zoo's trained drafter both
    accepted and rejected."""
    folder = family(arch)
    # a chat turn, as the drafters were trained (accepted), and a raw completion they never saw (rejected)
    prompts = tmp_path / "prompts.jsonl"
    chat = (folder / "prompts.jsonl").read_text().splitlines()[0]
    raw = (folder / "prompts.txt").read_text().splitlines()[1]
    prompts.write_text(f"{chat}\n{json.dumps({'prompt': raw})}\n")
    report = tmp_path / "report.json"
    proc = dflash_gguf("validate", "--target", folder / "target-F16.gguf", "--draft", folder / f"{variant}.gguf",
                       "--prompts", prompts, "-n", "24", "--backend", "cpu", "--threads", "1", "--exact",
                       "--report", report)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(report.read_text())
    assert result["exact"] and result["lossless"], result["prompts"]
    assert result["proven_by_replay"] == result["produced"] == 48, result["prompts"]
    # the trained drafter is accepted on prompts it never saw, and rejected: every rollback path ran
    assert 0 < result["accepted"] < result["drafted"], (result["accepted"], result["drafted"])


@pytest.mark.integration
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_draft_length_auto_serves_a_recurrent_target(variant, family, llama_bin, tmp_path):
    """Patch 0016: with `--spec-draft-n-max auto` the hybrid LFM2 target serves (0008's limit of 64
    made its context keep 64 state snapshots per sequence, and its graph aborted llama-server at
    start-up), and under --exact the output is the target's own, every token proven."""
    folder = family("lfm2")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join((folder / "prompts.jsonl").read_text().splitlines()[:2]) + "\n")
    report = tmp_path / "report.json"
    proc = dflash_gguf("validate", "--target", folder / "target-F16.gguf", "--draft", folder / f"{variant}.gguf",
                       "--prompts", prompts, "-n", "24", "--backend", "cpu", "--threads", "1", "--exact", "--rounds", "1",
                       "--report", report, "--", "--spec-draft-n-max", "auto")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(report.read_text())
    assert result["exact"] and result["lossless"]
    assert result["proven_by_replay"] == result["produced"] == 48


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("arch", [a for a in ARCHS if not FAMILIES[a].limitation])
def test_every_committed_zoo_drafter_met_the_ten_minute_goal(arch, variant):
    """What `make train-zoo` recorded of each committed drafter (train's own held-out `validate`, 20
    prompts it never saw): lossless, at least 1.5 tokens a target step, in under 10 minutes of
    teacher and training on the 2-core machine (one or two threads, as recorded). A toy change that
    leaves a family unlearnable (Muse Glimmer's sandwich norm at the mixers' gain: tau 1.03) fails
    here, not only in the figures."""
    from training.fixtures.families import trained_record

    record = trained_record(arch, variant)
    assert record is not None, f"no trained drafter for {arch} {variant}: make train-zoo ARCHS={arch}"
    held = record["held_out"]
    assert held["lossless"] and held["prompts"] >= 20, held
    assert held["tau"] >= 1.5, held
    assert record["teacher_seconds"] + record["train_seconds"] < 600, record


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("arch", [a for a in ARCHS if not FAMILIES[a].limitation])
def test_every_committed_zoo_drafter_is_both_accepted_and_rejected(arch, variant):
    """The zoo's goal for its drafters: on held-out prompts, between 20 % and 95 % of the drafted
    tokens accepted, so that both the accepted path and the rollback run in every family's tests."""
    from training.fixtures.families import trained_record

    held = trained_record(arch, variant)["held_out"]
    assert 0.20 <= held["acceptance_rate"] <= 0.95, held


def test_every_family_the_product_knows_keys_of_is_in_the_zoo():
    """doctor's target keys (dflash_gguf/families.py) are proven on a zoo target of each family that has
    them (test_doctor_names_a_target_without_its_family_keys), so none may name a family the zoo lacks."""
    assert set(TARGET_KEYS) - set(FAMILIES) == set()


@pytest.mark.integration
@pytest.mark.parametrize("arch", [a for a in ARCHS if a in RECORDS_LAST_OUTPUT])
def test_a_drafter_may_tap_the_last_layer_where_the_graph_records_it(arch, family, llama_bin, tmp_path):
    """The nemotron_h and deepseek4 graphs build the last layer's output when a drafter asks for it
    (RECORDS_LAST_OUTPUT): doctor accepts a drafter whose last tap is that output, and the patched
    llama-server serves the pair losslessly. Before ggml_patches/0012 the server's probe never asked
    for it and refused the drafter ("... is not recorded by the nemotron_h graph")."""
    folder = family(arch)
    with GGUFFile(folder / "dflash.gguf") as drafter:
        taps = drafter.kv[DFlash.TARGET_LAYERS]
    moved = [*list(taps.value)[:-1], FAMILIES[arch].num_layers]
    last = edited_copy(folder / "dflash.gguf", tmp_path / "dflash-last.gguf",
                       set_kv=(KV(DFlash.TARGET_LAYERS, taps.type, moved, taps.sub_type),))
    assert doctor(folder / "target-F16.gguf", last) == (0, [])
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text((folder / "prompts.jsonl").read_text().splitlines()[0] + "\n")
    report = tmp_path / "report.json"
    proc = dflash_gguf("validate", "--target", folder / "target-F16.gguf", "--draft", last, "--prompts", prompts,
                       "-n", "16", "--backend", "cpu", "--threads", "1", "--report", report)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(report.read_text())
    assert result["lossless"] and result["drafted"] > 0, result


# Targets built apart from the zoo: the family's config class at another geometry, and transformers'
# own initialisation (std 0.02) in place of the zoo's learnable scales; its next-token distribution
# is nearly flat, so greedy choices are near-ties, the hardest case for a replay to agree with.
INDEPENDENT = {
    "qwen35": {"num_hidden_layers": 6, "layer_types": ["linear_attention", "linear_attention", "full_attention"] * 2},
    "gemma4": {"num_hidden_layers": 5, "layer_types": ["sliding_attention"] * 2 + ["full_attention"] +
               ["sliding_attention"] + ["full_attention"], "sliding_window": 8},
    "gpt-oss": {"num_hidden_layers": 6, "layer_types": ["full_attention", "sliding_attention"] * 3, "sliding_window": 8},
    "lfm2": {"num_hidden_layers": 6, "full_attn_idxs": [1, 4]},
}


def independent_pair(arch: str, folder: Path) -> Path:
    """target-F16.gguf and a seeded (untrained) dflash.gguf of the family, built apart from the zoo."""
    from dataclasses import replace

    from dflash_gguf.convert.converter import convert
    from training.fixtures.families import VOCABULARIES, upstream_convert, write_hf_target
    from training.fixtures.family_drafters import write_drafter

    fam = FAMILIES[arch]
    fam = replace(fam, toy={**fam.toy, **INDEPENDENT[arch]})
    write_hf_target(fam, folder / "hf", seeded=False, seed=20261203)
    upstream_convert(fam, folder / "hf", folder / "target-F16.gguf")
    write_drafter(fam, "dflash", folder / "hf", folder / "dflash-hf", VOCABULARIES[fam.tokenizer].mask)
    convert(folder / "dflash-hf", folder / "target-F16.gguf", folder / "dflash.gguf", "f16")
    return folder


@pytest.mark.integration
@pytest.mark.parametrize("arch", sorted(INDEPENDENT))
def test_a_target_built_apart_from_the_zoo_is_proven_too(arch, family, llama_bin, tmp_path):
    """The same proof on a recurrent / sliding-window target the fixtures did not shape: under --exact
    every emitted token proven by replay, identical to the target alone, every draft rejected and
    rolled back (an untrained drafter)."""
    zoo = family(arch)  # its prompts
    folder = independent_pair(arch, tmp_path)
    prompts = tmp_path / "prompts.jsonl"
    chat = (zoo / "prompts.jsonl").read_text().splitlines()[0]
    raw = (zoo / "prompts.txt").read_text().splitlines()[1]
    prompts.write_text(f"{chat}\n{json.dumps({'prompt': raw})}\n")
    report = tmp_path / "report.json"
    proc = dflash_gguf("validate", "--target", folder / "target-F16.gguf", "--draft", folder / "dflash.gguf",
                       "--prompts", prompts, "-n", "24", "--backend", "cpu", "--threads", "1", "--exact",
                       "--report", report)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(report.read_text())
    assert result["exact"] and result["lossless"], result["prompts"]
    assert result["proven_by_replay"] == result["produced"] == 48, result["prompts"]
    assert result["drafted"] > result["accepted"], (result["accepted"], result["drafted"])


# --- doctor, family by family (files only: --no-run) -----------------------------------------

def doctor(target, draft, *args):
    proc = dflash_gguf("doctor", "--target", target, "--draft", draft, "--json", "--no-run", *args)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return proc.returncode, [f["check"] for f in json.loads(proc.stdout)["findings"]]


@pytest.mark.upstream
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("arch", ARCHS)
def test_doctor_finds_nothing_on_a_healthy_pair(arch, variant, family):
    folder = family(arch)
    assert doctor(folder / "target-F16.gguf", folder / f"{variant}.gguf",
                  "--checkpoint", folder / f"{variant}-hf") == (0, [])


@pytest.mark.upstream
@pytest.mark.parametrize("arch", [a for a in ARCHS if FAMILIES[a].target_keys])
def test_doctor_names_a_target_without_its_family_keys(arch, family, tmp_path):
    folder = family(arch)
    keys = tuple(f"{arch}.{key}" for key in FAMILIES[arch].target_keys)
    stripped = edited_copy(folder / "target-F16.gguf", tmp_path / "target-old.gguf", drop=keys)
    assert doctor(stripped, folder / "dflash.gguf") == (1, ["target-metadata"])


@pytest.mark.upstream
@pytest.mark.parametrize("arch", [a for a in ARCHS if FAMILIES[a].dflash2.sliding_window])
def test_doctor_names_a_drafter_without_its_sliding_window(arch, family, tmp_path):
    folder = family(arch)
    stripped = edited_copy(folder / "dflash2.gguf", tmp_path / "dflash2-full.gguf",
                           drop=(DFlash.SLIDING_WINDOW, DFlash.SLIDING_WINDOW_PATTERN))
    assert doctor(folder / "target-F16.gguf", stripped, "--checkpoint", folder / "dflash2-hf") == (1, ["sliding-window"])


@pytest.mark.upstream
@pytest.mark.parametrize("arch", [a for a in ARCHS if "rope.dimension_sections" in FAMILIES[a].target_keys])
def test_doctor_names_a_drafter_without_rope_sections(arch, family, tmp_path):
    folder = family(arch)
    stripped = edited_copy(folder / "dflash.gguf", tmp_path / "dflash-old.gguf",
                           drop=(DFlash.ROPE_DIMENSION_SECTIONS,))
    assert doctor(folder / "target-F16.gguf", stripped) == (1, ["mrope-sections"])


@pytest.mark.upstream
@pytest.mark.parametrize("arch, unserved", [("nemotron_h", "nemotron_h_moe"), ("llama", "deepseek2")])
def test_doctor_names_a_target_that_records_no_layer_inputs(arch, unserved, family, tmp_path):
    folder = family(arch)
    other = edited_copy(folder / "target-F16.gguf", tmp_path / f"target-{unserved}.gguf",
                        rename_prefix=(f"{arch}.", f"{unserved}."),
                        set_kv=(KV("general.architecture", GGUFValueType.STRING, unserved),))
    proc = dflash_gguf("doctor", "--target", other, "--draft", folder / "dflash.gguf", "--json", "--no-run")
    findings = json.loads(proc.stdout)["findings"]
    assert proc.returncode == 1 and [f["check"] for f in findings] == ["target-taps"]
    assert UNSERVED[unserved] in findings[0]["message"]


@pytest.mark.upstream
def test_train_reads_a_hybrid_target_whose_shape_is_per_layer(family):
    """LFM2 stores head_count_kv per layer (0 on its convolution layers) and normalises its last hidden
    state with token_embd_norm: train takes the attention layers' heads and that norm (it raised a
    TypeError, then 'tensor output_norm.weight is missing')."""
    torch = pytest.importorskip("torch")
    from dflash_gguf.train.frozen import FrozenTarget, GGUFWeights

    weights = GGUFWeights(family("lfm2") / "target-F16.gguf")
    assert (weights.shape.n_head, weights.shape.n_head_kv) == (4, 2)
    frozen = FrozenTarget(weights, dtype=torch.float32)
    assert torch.equal(frozen.model.norm.weight, weights.get("token_embd_norm.weight"))


@pytest.mark.upstream
def test_train_reads_a_target_whose_every_ffn_is_a_moe(family):
    """DeepSeek-V4 targets carry no feed_forward_length, only the experts' width: train takes that
    (it stopped with "key 'deepseek4.feed_forward_length' is missing" before the teacher ran)."""
    pytest.importorskip("torch")
    from dflash_gguf.train.frozen import GGUFWeights

    target = family("deepseek4") / "target-F16.gguf"
    with GGUFFile(target) as f:
        assert f.get("deepseek4.feed_forward_length") is None
        experts = f.get("deepseek4.expert_feed_forward_length")
    assert (GGUFWeights(target).shape.n_ff, experts) == (128, 128)


@pytest.mark.integration
@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_the_teacher_answers_a_recurrent_target_one_conversation_at_a_time(arch, family, llama_bin):
    """Batched steps of 16 sequences of the pinned llama.cpp went wrong on recurrent targets: NaN logits
    for sequences 8 and 12 of the LFM2 toy (answered with token 0, stored as NaN log-probabilities: its
    drafter learnt nothing, held-out tau 1.00), layer inputs past float16, and a crash in llama_decode
    on the Qwen3.5 toy. Such targets are answered one conversation at a time: each answer is the one
    the target gives that conversation alone, every value finite."""
    np = pytest.importorskip("numpy")
    from dflash_gguf.train.teacher import Teacher

    prompts = [[300 + (7 * i + j) % 64 for j in range(6 + i % 5)] for i in range(16)]
    with Teacher(family(arch) / "target-F16.gguf", [2], n_ctx=64, n_seq=16, top_k=4, threads=1,
                 bin_dir=llama_bin) as teacher:
        assert teacher.recurrent and teacher.n_seq == 1
        together = teacher.answer(prompts, 16)
        alone = [teacher.answer([prompt], 16)[0] for prompt in prompts]
    assert [a.ids for a in together] == [a.ids for a in alone]
    assert all(np.isfinite(a.top_logp.astype(np.float32)).all() and np.isfinite(a.taps.astype(np.float32)).all()
               for a in together)
