"""What each patch of ggml_patches/series changes, through the patched llama.cpp programs a user runs.

- 0001-dflash-startup-checks: a drafter that does not fit its target ends llama-server, llama-cli
  and llama-speculative-simple with exit status 1 and one "dflash: ..." line naming both values,
  instead of a GGML_ASSERT abort (SIGABRT, status 134, core dump).
- 0002-dflash-swa-causal: a drafter with sliding-window layers and no `is_causal` drafts what the
  z-lab reference drafts (sliding layers causal, full layers non-causal); one without sliding
  layers drafts as before.
- 0003-dflash-log-drafts: at debug verbosity (-lv 5) each draft is logged as
  `dflash draft: seq_id=.. pos=.. id_last=.. n=.. ids=[..]`, on stderr, server included.
- 0005-server-yield-without-wakeups: llama-server decodes and drafts without waking its task worker
  thread for nothing: counted as the threads' voluntary context switches per generated token.
- 0006-amx-tile-config-rodata: a quantized model (Q8_0, Q4_0) answers on a CPU with AMX instead of
  dying with SIGILL at its first matrix multiply.
- 0009-spec-tree-verify: `--spec-tree-budget N` verifies a best-first draft tree of the DFlash /
  DFlash 2 block in one target batch: the target's own tokens, more of them per step (at least the
  1.25x and 1.15x the chain that issue 47 asks, on SmolLM2's DFlash 2 and the trained pair's DFlash); the chain
  where the tree cannot serve (temperature > 0, recurrent targets); one line and exit 2 for a
  budget it cannot serve.
- 0017-spec-tree-p-min: `--spec-tree-p-min P` stops the tree where the best path left is below P: fewer
  nodes verified, steps of different sizes, the same tokens; one line and exit 2 for a floor it cannot use.
- 0008 / 0013 / 0014 / 0015 (`--spec-draft-n-max auto`): the tokens of the static setting, the
  choices and step costs in every response's timings, parking with probes whose share of a parked
  slot's steps is bounded, costs that start from the warm passes.
- 0018-spec-auto-kept-features-are-memory: what a parked slot keeps for its drafter is dropped,
  saved and restored with the slot's memory (a prompt cache entry) and fed only before a draft.
- 0019-spec-auto-costs-beyond-measured: a step wider than any measured one is priced by the measured
  cost of a token; the timings' cost curves reach the widest step the slots can make.
- 0020-spec-time-by-part: with a drafter, each response's timings say where its generation's time went
  (the target's steps, draft passes, the drafter's feed, sampling).
- 0021-spec-auto-probes-together: a long request is probed at its first step, a parked slot joins or
  rides another slot's draft pass, and a ride keeps its probe schedule.
- 0022-spec-auto-probe-credit: a parked slot probes only as often as its budget has earned, from none at
  start-up: about once per cap steps, not every 8, 16, 32, ... steps after the start or a draft.
- 0023-spec-auto-deep-depths-lean-on-shallower: a depth's acceptance rate is shrunk toward the rate of the
  depth above it, so after whole accepted blocks the whole block is expected (not 0.5 a depth).
- 0024-spec-auto-tokens-by-accepted-length: each auto response counts its tokens by the accepted length of
  the scored block whose stretch they are in (a probe stands for its whole parked stretch).
- 0025-spec-auto-openings: a request's first step is decided by what earlier requests' first blocks met, not by
  the counts carried from the last request's end.
- 0026-spec-auto-probe-priced-with-its-feed: a parked slot's probe is priced with the feed of the features it kept,
  so its probes keep to 0022's budget.
- 0027-spec-auto-calibrate-whole-blocks: with `--spec-draft-p-min`, auto's start-up calibration verifies whole
  blocks; p_min cuts the later ones as before.

`DFLASH_GGUF_TEST_LLAMA_BIN=<bin dir> pytest tests/runner/test_patches.py` runs the same tests against the
programs of another build; against an unpatched build of the pinned tree all 28 fail (the two of 0006 only on a CPU with AMX).
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from dflash_gguf.convert.converter import convert
from training.fixtures.target_model import convert_target
from dflash_gguf.runner.prompts import read_prompts
from dflash_gguf.runner.server import LlamaServer, free_port

from tests.llama_tools import parse_drafts, run_tool
from tests.malformed import edit_config, regenerate_weights
from tests.reference_drafts import reference_draft, reference_layer_causality, tokenize

pytestmark = pytest.mark.integration

PROMPT = "Hello world, this is a test of"
N_DRAFT = 15  # block size 16 - 1: the whole block of the fixture drafters
# exact numerics on both sides: float32 weights (--outtype f32) and float32 KV caches in llama.cpp,
# float32 PyTorch for the reference (see test_first_draft_matches_reference)
F32_CACHES = ("-ctk", "f32", "-ctv", "f32", "-ctkd", "f32", "-ctvd", "f32")


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------

def _fake_target(fixtures: Path, folder: Path, **config) -> Path:
    """The tiny target's HF folder without weights (all the converter reads), config edited."""
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (fixtures / "target-hf" / name).is_file():
            shutil.copyfile(fixtures / "target-hf" / name, folder / name)
    data = json.loads((fixtures / "target-hf" / "config.json").read_text())
    data.update(config)
    (folder / "config.json").write_text(json.dumps(data, indent=2))
    return folder


@pytest.fixture(scope="session")
def misfit_drafters(fixtures: Path, tmp_path_factory) -> dict[str, Path]:
    """Drafter GGUFs that do not fit the tiny target (6 layers, hidden 64), each like dflash-b16.

    Our converter refuses them against the real target, so each is converted against a fake target
    that it does fit (a user converting against the wrong target, or with another converter).
    """
    work = tmp_path_factory.mktemp("misfit")
    out = {}

    # trained for a wider target: hidden 128
    src = shutil.copytree(fixtures / "dflash-b16", work / "wide-128")
    regenerate_weights(edit_config(src, hidden_size=128))
    out["wide-128"] = work / "wide-128.gguf"
    convert(src, _fake_target(fixtures, work / "target-wide", hidden_size=128), out["wide-128"])

    # taps layer 8 of a deeper target: GGUF dflash.target_layers [1, 3, 9], past the target's 6
    src = shutil.copytree(fixtures / "dflash-b16", work / "deep-ids")
    edit_config(src, dflash__target_layer_ids=[0, 2, 8])
    out["deep-ids"] = work / "deep-ids.gguf"
    convert(src, _fake_target(fixtures, work / "target-deep", num_hidden_layers=12), out["deep-ids"])

    # taps the target's last layer (HF id 5, GGUF 6 == n_layer): within its depth, but the qwen3 graph
    # records the inputs of layers 1..5 only (our converter refuses it too: converted against 7 layers)
    src = shutil.copytree(fixtures / "dflash-b16", work / "last-id")
    edit_config(src, dflash__target_layer_ids=[0, 2, 5])
    out["last-id"] = work / "last-id.gguf"
    convert(src, _fake_target(fixtures, work / "target-7", num_hidden_layers=7), out["last-id"])
    return out


@pytest.fixture(scope="session")
def f32_models(fixtures: Path, tmp_path_factory) -> dict[str, Path]:
    """The tiny target and the drafters dflash-b16 and dflash-swa as float32 GGUFs."""
    work = tmp_path_factory.mktemp("f32")
    models = {"target": convert_target(fixtures / "target-hf", work / "target-f32.gguf", "f32")}
    for name in ("dflash-b16", "dflash-swa"):
        models[name] = work / f"{name}-f32.gguf"
        convert(fixtures / name, models["target"], models[name], "f32")
    return models


# ---------------------------------------------------------------------------------------------
# 0001: a drafter that does not fit its target is refused with one line
# ---------------------------------------------------------------------------------------------

# the line naming both values, per misfit drafter
MISFIT_LINES = {
    "wide-128": r"dflash: draft embedding length 128 != target 64\b",
    "deep-ids": r"dflash: draft target layer 9 \(dflash\.target_layers\) is outside the target's layers 1\.\.6\b",
    "last-id": r"dflash: draft target layer 6 \(dflash\.target_layers\) is not recorded by the qwen3 graph, "
               r"which provides layers 1\.\.5\b",
}

TOOL_ARGS = {
    "llama-server": ("--host", "127.0.0.1"),  # and --port, a free one
    "llama-cli": ("-p", "Hello", "-n", "4", "-st"),
    "llama-speculative-simple": ("-p", "Hello", "-n", "8"),
}


@pytest.mark.parametrize("tool", list(TOOL_ARGS))
@pytest.mark.parametrize("misfit", list(MISFIT_LINES))
def test_misfit_drafter_is_refused_with_one_line(llama_bin: Path, target_gguf: Path,
                                                 misfit_drafters: dict[str, Path], misfit: str, tool: str):
    """Unpatched (measured on the pinned tree, CPU): SIGABRT, exit status 134, core dump, with
    GGML_ASSERT(ggml_can_repeat(b, a)) (wide-128), GGML_ASSERT(lid <= model.hparams.n_layer())
    (deep-ids), GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is null")
    (last-id; llama-server only reaches it at the first request, so it starts and serves)."""
    args = TOOL_ARGS[tool] + (("--port", str(free_port())) if tool == "llama-server" else ())
    proc = run_tool(llama_bin, tool, "-m", target_gguf, "-md", misfit_drafters[misfit],
                    "--spec-type", "draft-dflash", "-c", "512", "-t", "1", *args, timeout=30)
    log = proc.stdout + proc.stderr
    tail = "\n".join(log.splitlines()[-15:])
    assert proc.returncode == 1, f"{tool} exited with status {proc.returncode}, expected 1:\n{tail}"
    assert "GGML_ASSERT" not in log and "core dumped" not in log.lower(), tail
    lines = [line for line in log.splitlines() if re.search(MISFIT_LINES[misfit], line)]
    assert len(lines) == 1, f"expected one line matching {MISFIT_LINES[misfit]!r}, got {len(lines)}:\n{tail}"


# ---------------------------------------------------------------------------------------------
# 0002 (and 0003, which makes the drafts visible): drafts equal the reference's
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("drafter", ["dflash-swa", "dflash-b16"])
def test_first_draft_matches_reference(llama_bin: Path, fixtures: Path, f32_models: dict[str, Path],
                                       drafter: str):
    """llama-speculative-simple's first draft (greedy, the whole block of 15) equals the z-lab
    reference's (dflash==0.1.0 DFlashDraftModel, float32) for the same context and block.

    Prompt "Hello world, this is a test of" = [9707, 1879, 11, 419, 374, 264, 1273, 315]:
    context = the first 7 tokens, block = [315, mask x 15] at positions 7..22.

    dflash-swa (layer_types sliding, sliding, full; sliding_window 32; no is_causal), measured:
      reference (sliding layers causal, full non-causal): 146045 146045 142626 79176 102379 42536 40155 x9
      unpatched llama.cpp (0001 + 0003, without 0002):    40155 x15, i.e. the reference with every
                                                          layer non-causal (asserted below too); the
                                                          same with the fully unpatched build and f16
                                                          models, printed by a modified
                                                          llama-speculative-simple
      patched:                                            the reference
    dflash-b16 (no sliding layers, non-causal everywhere in both): unchanged by 0002, the reference
      59676 59676 59676 52275 x6 35002 19478 19478 52275 x3.
    Without 0003 there is no `dflash draft:` line and the test fails on that.

    Numerics: the models are converted with --outtype f32 and llama.cpp runs with f32 KV caches
    (-ctk/-ctv/-ctkd/-ctvd f32), so all 15 tokens are compared exactly. With the f16 target and
    f16/bf16 drafters the first drafts happened to agree as well, but later drafts of the same run
    already differ between f16 and f32 (the reference's smallest top-2 logit gap in these blocks is
    about 0.01 for logits of about 4), so a 16-bit comparison would depend on the CPU's kernels.
    """
    target_dir = fixtures / "target-hf"
    ids = tokenize(target_dir, PROMPT)
    proc = run_tool(llama_bin, "llama-speculative-simple", "-m", f32_models["target"],
                    "-md", f32_models[drafter], "--spec-type", "draft-dflash", "--spec-draft-n-max", str(N_DRAFT),
                    "-p", PROMPT, "-n", str(N_DRAFT + 1), "--temp", "0", "-c", "512", "-t", "1",
                    *F32_CACHES, "-lv", "5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    drafts = parse_drafts(proc.stderr)
    assert drafts, "no `dflash draft:` line at -lv 5 (ggml_patches/0003-dflash-log-drafts.patch missing?)"
    first = drafts[0]
    # llama.cpp tokenized the prompt as the reference did: context ids[:-1], block starts with ids[-1]
    assert (first.pos, first.id_last) == (len(ids) - 1, ids[-1])

    expected = reference_draft(fixtures / drafter, target_dir, ids[:-1], ids[-1], N_DRAFT)
    assert first.ids == expected

    causal = reference_layer_causality(fixtures / drafter)
    all_noncausal = reference_draft(fixtures / drafter, target_dir, ids[:-1], ids[-1], N_DRAFT,
                                    causal=[False] * len(causal))
    if drafter == "dflash-swa":
        assert causal == [True, True, False]
        # what upstream computes (one non-causal switch for every layer) is told apart by this test
        assert all_noncausal != expected
    else:
        assert causal == [False, False] and all_noncausal == expected


def test_server_logs_drafts(llama_bin: Path, fixtures: Path, f32_models: dict[str, Path],
                                      tmp_path: Path):
    """llama-server -lv 5 logs each draft; its first draft (context = the whole prompt,
    block = [the target's first token, mask x 15]) is the reference's, for dflash-swa.

    Unpatched: no `dflash draft:` line (0003), and the draft itself would be the all-non-causal one (0002).
    """
    target_dir = fixtures / "target-hf"
    ids = tokenize(target_dir, PROMPT)
    log = tmp_path / "llama-server.log"
    args = ["-md", f32_models["dflash-swa"], "--spec-type", "draft-dflash", "--spec-draft-n-max", str(N_DRAFT),
            "--parallel", "1", "-c", "512", "-t", "1", *F32_CACHES, "-lv", "5"]
    with LlamaServer(f32_models["target"], args, bin_dir=llama_bin, log_path=log) as server:
        answer = server.client.complete(ids, 4)
    assert answer.n_predicted == 4
    drafts = parse_drafts(log.read_text(errors="replace"))
    assert drafts, "no `dflash draft:` line in llama-server's log at -lv 5"
    first = drafts[0]
    assert first.pos == len(ids)
    assert first.ids == reference_draft(fixtures / "dflash-swa", target_dir, ids, first.id_last, N_DRAFT)


def _voluntary_switches(pid: int) -> int:
    """Voluntary context switches of every thread of a process so far (Linux /proc)."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            text = status.read_text()
        except OSError:  # a thread that just ended
            continue
        total += int(re.search(r"^voluntary_ctxt_switches:\s*(\d+)", text, re.M).group(1))
    return total


@pytest.mark.serial  # -t 2 threads that wait at OpenMP barriers sleep (and switch) when other work holds a core
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts context switches in /proc")
@pytest.mark.parametrize("drafter", [None, "dflash2"])
def test_server_decode_does_not_wake_the_task_worker(llama_bin: Path, trained_pair: dict[str, Path],
                                                      drafter: str | None, tmp_path: Path):
    """Every decode, draft and speculative process runs inside yield_to_queue(); unpatched, each
    one woke the server's task worker thread to decline the NEXT_RESPONSE marker, and the worker
    slept again: about 3 voluntary context switches per token alone, 1.7 with DFlash 2 (0005)."""
    from training.fixtures.trained_gguf import held_out_prompts

    prompts = held_out_prompts()[:8]
    args = ["--parallel", "1", "-c", "1024", "-t", "2"]
    if drafter:
        args += ["-md", trained_pair[drafter], "--spec-type", "draft-dflash"]
    with LlamaServer(trained_pair["target"], args, bin_dir=llama_bin, log_path=tmp_path / "server.log") as server:
        ids = [server.client.tokenize(p, add_special=True) for p in prompts]
        server.client.complete(ids[0][:8], 4)  # warm-up: threads and buffers exist before counting
        before = _voluntary_switches(server.pid)
        tokens = sum(server.client.complete(i, 64, ignore_eos=True).n_predicted for i in ids)
        switches = _voluntary_switches(server.pid) - before
    assert tokens >= 8 * 60
    assert switches / tokens < 0.5, f"{switches} voluntary context switches for {tokens} tokens"


def _has_amx() -> bool:
    try:
        return "amx_int8" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_quantized_target_runs_on_this_cpu(llama_bin: Path, target_gguf: Path, qtype: str, tmp_path: Path):
    """A quantized target answers (0006): on an AMX CPU the unpatched build's AMX kernels load an
    empty tile configuration and the first matrix multiply dies with SIGILL; without AMX the
    kernels are not compiled and this passes either way."""
    quantized = tmp_path / f"target-{qtype}.gguf"
    proc = run_tool(llama_bin, "llama-quantize", target_gguf, quantized, qtype, "1")
    assert proc.returncode == 0, proc.stderr[-1000:]
    with LlamaServer(quantized, ["-t", "1", "-c", "256"], bin_dir=llama_bin, log_path=tmp_path / "server.log") as server:
        answer = server.client.complete("Hello world", 8, ignore_eos=True)
    assert answer.n_predicted == 8, f"AMX CPU: {_has_amx()}"


# ---------------------------------------------------------------------------------------------
# 0008: --spec-draft-n-max auto chooses the verified draft length per slot and step
# ---------------------------------------------------------------------------------------------

# the decision line 0008 logs at -lv 5, one per slot and generation step
AUTO_LINE = re.compile(r"spec auto: slot=(\d+) n=(\d+) parked=([01]) E=([\d.]+) cost_ms=([\d.]+) why=(\w+)")


def test_draft_length_auto_is_identical_and_parks(llama_bin: Path, trained_pair: dict[str, Path], tmp_path: Path):
    """`--spec-draft-n-max auto` emits the tokens of the static setting and of the target alone at
    temperature 0 (only how many drafted tokens are verified changes), reports its choices in each
    response's timings, and parks (plain target steps, no draft pass) where drafting cannot pay.

    The trained pair's DFlash 2 drafter has an 8-token block (n 0..7). On CPU its draft pass costs
    about 5 target tokens (measured 4-5 ms against 0.8-1.2 ms per plain step on 2 cores) while its
    drafts are accepted about 4 deep, so after the start-up calibration (4 full drafts, 2 plain
    steps) the controller parks, drafting a block now and then only to score it (a probe, as often as
    0014 and 0022 allow).
    Unpatched: "auto" is not a number and llama-server exits at argument parsing."""
    # random hexadecimal digits: nothing for a drafter to learn, so parking wins on any machine (on a slow
    # memory bus the held-out prompts drafted: a plain step cost 1.8 ms against 9.1 for 7 tokens accepted ~7 deep)
    rng = random.Random(0)
    prompts = [" ".join(f"{rng.getrandbits(32):08x}" for _ in range(40)) for _ in range(3)]
    common = ["--parallel", "1", "-c", "1024", "-t", "1"]
    spec = ["-md", trained_pair["dflash2"], "--spec-type", "draft-dflash"]
    runs: dict[str, list] = {}
    for name, args in (("alone", common), ("static", common + spec + ["--spec-draft-n-max", "7"]),
                       ("auto", common + spec + ["--spec-draft-n-max", "auto", "-lv", "5"])):
        with LlamaServer(trained_pair["target"], args, bin_dir=llama_bin, log_path=tmp_path / f"{name}.log") as server:
            runs[name] = [server.client.complete(p, 64, ignore_eos=True) for p in prompts]

    agree = [i for i in range(len(prompts)) if runs["static"][i].tokens == runs["alone"][i].tokens]
    assert agree, "the static setting and the target alone disagree on every prompt (batching noise?)"
    for i in range(len(prompts)):
        assert runs["auto"][i].tokens == runs["static"][i].tokens, f"prompt {i}: auto differs from static"

    decisions = AUTO_LINE.findall((tmp_path / "auto.log").read_text(errors="replace"))
    steps = 0
    for answer in runs["auto"]:
        t = answer.timings
        hist, offered, accepted = t["draft_n_chosen_hist"], t["draft_offered_per_depth"], t["draft_accepted_per_depth"]
        assert len(hist) == 8 and len(offered) == len(accepted) == 7
        assert sum(n * c for n, c in enumerate(hist)) == answer.draft_n
        assert sum(accepted) == answer.draft_n_accepted
        assert offered[0] == sum(hist[1:]) and all(a <= o for a, o in zip(accepted, offered))
        # whole drafted blocks, scored afterwards: as deep as the longest block the request drafted (a probe
        # near its end drafts only what the slot has room for), fewer at each depth than at the one before
        full = t.get("draft_full_offered_per_depth", [])
        assert len(full) <= 7 and full == sorted(full, reverse=True), full
        steps += sum(hist)
    assert len(runs["auto"][0].timings["draft_full_offered_per_depth"]) == 7  # the start-up calibration's blocks
    assert len(decisions) == steps, "one `spec auto:` line per generation step"
    assert [int(d[1]) for d in decisions[:6]] == [7, 7, 7, 7, 0, 0]  # start-up calibration
    after = decisions[6:]
    parked = [d for d in after if d[2] == "1"]
    assert len(parked) > len(after) / 2, f"parked {len(parked)} of {len(after)} steps"
    probes = [i for i, d in enumerate(after) if d[5].startswith("probe")]
    assert all(int(after[i][1]) == 0 for i in probes)  # a probe scores its block, it verifies none of it


AUTO_COSTS = re.compile(r"spec auto: .* draft_ms=([\d.]+) verify1_ms=([\d.]+) verify(\d+)_ms=([\d.]+)")


def test_draft_length_auto_reports_its_step_costs(llama_bin: Path, trained_pair: dict[str, Path], tmp_path: Path):
    """Patch 0013: every auto response carries the step costs its last step was decided with
    (`draft_verify_cost_ms` by batch tokens, `draft_pass_cost_ms` by drafting sequences): the values
    of the last `spec auto:` line, finite and positive, the verify curve covering the whole block plus
    one; validation/acceptance.py's run limit is computed from them with 0024's stretches (1.0 at least: n = 0
    is a choice).
    Without 0013 the timings hold neither field."""
    from dflash_gguf.validation.acceptance import run_limit
    from training.fixtures.trained_gguf import held_out_prompts

    args = ["--parallel", "1", "-c", "1024", "-t", "1", "-md", trained_pair["dflash2"], "--spec-type", "draft-dflash",
            "--spec-draft-n-max", "auto", "-lv", "5"]
    with LlamaServer(trained_pair["target"], args, bin_dir=llama_bin, log_path=tmp_path / "auto.log") as server:
        answers = []
        for prompt in held_out_prompts()[:2]:
            answers.append(server.client.complete(prompt, 32, ignore_eos=True))
            log = (tmp_path / "auto.log").read_text(errors="replace")
            t = answers[-1].timings
            verify, draft = t["draft_verify_cost_ms"], t["draft_pass_cost_ms"]
            assert len(verify) >= 8 and len(draft) >= 1, t
            assert all(math.isfinite(v) and v > 0 for v in [*verify, *draft]), t
            decision = AUTO_LINE.findall(log)[-1]
            if decision[5] == "limit":  # no room left for a draft: the line prices a plain step, verify(1)
                assert round(verify[0], 3) == float(decision[4])
            else:
                last = AUTO_COSTS.findall(log)[-1]
                width = int(last[2])  # the widest step the decision priced
                assert (round(draft[0], 3), round(verify[0], 3), round(verify[width - 1], 3)) == \
                    (float(last[0]), float(last[1]), float(last[3]))
    limit = run_limit(a.timings for a in answers)
    counted = sum(sum(a.timings.get("draft_full_tokens_by_accepted", [])) for a in answers)
    assert limit is not None and limit["limit"] >= 1.0 and sum(limit["best_lengths"].values()) == counted


# a whole decision line, and the price of the slot's feed on it (0026; none before)
DECISION = re.compile(r"spec auto: slot=\d+ n=\d+ parked=[^\n]*")
FEED_PRICE = re.compile(r" feed_ms=([\d.]+) kept=\d+")


def test_draft_length_auto_probes_cost_a_bounded_share(llama_bin: Path, trained_pair: dict[str, Path], tmp_path: Path):
    """Patch 0014: a slot that stays parked waits longer between probes than 0008's 64 steps where a
    draft pass is dear (the trained pair's DFlash 2 pass costs several plain steps on this CPU), up to
    the wait that keeps probes at about 1 % of the plain steps: ceil(probe / (0.01 * verify1)) by the
    costs logged at the probe, from 8 to 1024, a probe's price its draft pass (and since 0026 the feed of the
    rows the slot keeps, `feed_ms=`). Unpatched the waits stop at 64. The text: random hexadecimal digits, of
    which the drafter predicts nothing (a text it drafts restarts the schedule)."""
    rng = random.Random(1)
    texts = [" ".join(f"{rng.getrandbits(32):08x}" for _ in range(40)) for _ in range(8)]
    args = ["--parallel", "1", "-c", "1024", "-t", "1", "-md", trained_pair["dflash2"], "--spec-type", "draft-dflash",
            "--spec-draft-n-max", "auto", "-lv", "5"]
    def waits_so_far() -> tuple[list, list]:
        log = (tmp_path / "auto.log").read_text(errors="replace")
        lines = []
        for text in DECISION.findall(log):
            d, c, f = AUTO_LINE.search(text), AUTO_COSTS.search(text), FEED_PRICE.search(text)
            if d and c:  # a `limit` line (no room for a draft) has no costs: not a choice
                lines.append((d.groups(), c.groups(), float(f.group(1)) if f else 0.0))
        # any draft pass restarts a slot's wait: a probe (the schedule's, a request's first step's: 0021) or a
        # draft after the start-up (which resets the schedule to 8)
        passes = [i for i, (d, *_) in enumerate(lines) if d[5].startswith("probe") or (d[1] != "0" and d[5] != "calibrate")]
        # waits from a pass to the next probe with only parked steps between them
        return lines, [(a, b - a) for a, b in zip(passes, passes[1:])
                       if lines[b][0][5].startswith("probe") and all(lines[i][0][2] == "1" for i in range(a + 1, b))]

    with LlamaServer(trained_pair["target"], args, bin_dir=llama_bin, log_path=tmp_path / "auto.log") as server:
        # the schedule carries over between requests; on a loaded machine a cost measured high or low can make a
        # draft pay for a while (which restarts the schedule at 8): a few requests give a stretch that stays parked
        for prompt in texts:
            server.client.complete(prompt, 480, ignore_eos=True)
            lines, waits = waits_so_far()
            if waits and max(w for _, w in waits) > 64:
                break
    events = [(i, d[1], d[5]) for i, (d, *_) in enumerate(lines) if d[5] != "rate" or d[1] != "0"]
    assert waits and max(w for _, w in waits) > 64, f"waits between probes {waits}: capped at 0008's 64; {events[:40]}"
    # the cap follows the costs step by step: a wait ends by the largest cap its steps were decided with
    cap = lambda i: max(8, min(1024, math.ceil((float(lines[i][1][0]) + lines[i][2]) / (0.01 * float(lines[i][1][1])))))  # noqa: E731
    for a, wait in waits:
        caps = [cap(i) for i in range(a, a + wait + 1)]
        assert wait <= max(caps) + 1, (wait, min(caps), max(caps))


AUTO_COST_SAMPLE = re.compile(r"spec auto cost: (draft|verify) size=(\d+) ms=([\d.]+) estimate=([\d.]+)")


def test_draft_length_auto_costs_start_from_the_warm_passes(llama_bin: Path, trained_pair: dict[str, Path],
                                                             tmp_path: Path):
    """Patch 0015: the first 4 samples of a cost (a draft pass, a verify batch of a size) set it to the
    least of them, as the `spec auto cost:` debug line after each sample shows; later samples move it
    by a tenth of their difference, at most 3x the estimate. A cold first pass (the first touch of
    the weights) no longer prices drafting out. Unpatched there is no such line, and the first
    samples were averaged."""
    from training.fixtures.trained_gguf import held_out_prompts

    args = ["--parallel", "1", "-c", "1024", "-t", "1", "-md", trained_pair["dflash2"], "--spec-type", "draft-dflash",
            "--spec-draft-n-max", "auto", "-lv", "5"]
    with LlamaServer(trained_pair["target"], args, bin_dir=llama_bin, log_path=tmp_path / "auto.log") as server:
        for prompt in held_out_prompts()[:2]:
            server.client.complete(prompt, 48, ignore_eos=True)
    samples: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for kind, size, ms, estimate in AUTO_COST_SAMPLE.findall((tmp_path / "auto.log").read_text(errors="replace")):
        samples.setdefault((kind, int(size)), []).append((float(ms), float(estimate)))
    assert ("draft", 1) in samples and ("verify", 1) in samples and ("verify", 8) in samples, sorted(samples)
    for key, seen in samples.items():
        for i, (_, estimate) in enumerate(seen[:4]):
            assert estimate == pytest.approx(min(ms for ms, _ in seen[:i + 1]), abs=0.0015), (key, seen[:4])
        for (ms, estimate), (_, before) in zip(seen[4:], seen[3:]):
            assert estimate == pytest.approx(before + 0.1 * (min(ms, 3 * before) - before), abs=0.003), (key, ms)


# the drafter features a parked slot keeps on the host (0018), at -lv 5
KEPT_LINE = re.compile(r"dflash kept: seq_id=0 (fed|saved|restored|dropped)=(\d+)")
# a request's end, and a step that runs a draft pass (it drafts, or it probes)
SLOT_EVENT = re.compile(r"stop processing|spec auto: slot=0 (?:n=[1-9]\d* parked=0|n=0 parked=1 E=[\d.]+ cost_ms=[\d.]+ why=probe)")


def test_draft_length_auto_keeps_parked_features_as_memory(llama_bin: Path, trained_pair: dict[str, Path],
                                                           tmp_path: Path):
    """Patch 0018: what a parked slot keeps for its drafter is removed, saved and restored with the
    slot's memory, and fed only before a draft. Request A ends parked with rows kept: B's prompt cache
    save keeps them in A's entry and B's prompt clears them, unfed; C, A's prompt and answer plus more
    text, restores them from the entry and feeds them, with its own prompt, before its first draft.
    The drafter never misses a position (no "Drafts may degrade"), tokens are the target alone's.
    Unpatched: release fed the rows at A's end, the prompt was fed at once, no `dflash kept:` line.
    A is random hexadecimal digits, which park on any machine (held-out prompts drafted on a slow memory bus)."""
    from training.fixtures.trained_gguf import held_out_prompts

    rng = random.Random(0)
    prompts = [" ".join(f"{rng.getrandbits(32):08x}" for _ in range(40)), *held_out_prompts()[1:3]]
    common = ["--parallel", "1", "-c", "2048", "-t", "1"]
    auto = ["-md", trained_pair["dflash2"], "--spec-type", "draft-dflash", "--spec-draft-n-max", "auto", "-lv", "5"]
    def run(name: str, args: list[str]) -> list:
        with LlamaServer(trained_pair["target"], args, bin_dir=llama_bin, log_path=tmp_path / f"{name}.log") as server:
            ids = [server.client.tokenize(p, add_special=True) for p in prompts]
            a = server.client.complete(ids[0], 64, ignore_eos=True)
            b = server.client.complete(ids[1], 64, ignore_eos=True)
            # long enough to be probed at its first step (0021), as a parked slot probes only as its budget allows (0022)
            c = server.client.complete(ids[0] + a.tokens + ids[2][1:], 800, ignore_eos=True)
            return [a, b, c]

    def events_of(log: str) -> list[tuple[str, int]]:
        # the log as one stream of events: request ends, probes / drafting steps, and what happened to the kept rows
        return [(m.group(1), int(m.group(2))) if m.re is KEPT_LINE else ("end" if "stop" in m.group(0) else "draft", 0)
                for m in sorted([*KEPT_LINE.finditer(log), *SLOT_EVENT.finditer(log)], key=lambda m: m.start())]

    # A must end parked with rows kept; where costs measured under load made its last step a draft (nothing
    # kept), the controller chose so and the run says nothing about 0018: run it again, up to 3 times
    for _ in range(3):
        answers = {"auto": run("auto", common + auto)}
        log = (tmp_path / "auto.log").read_text(errors="replace")
        events = events_of(log)
        ends = [i for i, (kind, _) in enumerate(events) if kind == "end"]
        assert len(ends) == 3, events
        between = events[ends[0] + 1:ends[1]]  # from A's end to B's end
        saved = [n for kind, n in between if kind == "saved"]
        if saved and saved[0] > 0:
            break
    answers["alone"] = run("alone", common)
    assert [x.tokens for x in answers["auto"]] == [x.tokens for x in answers["alone"]]
    assert "may degrade" not in log
    assert any(kind == "fed" for kind, _ in events), events
    assert saved and saved[0] > 0, f"A ended with nothing kept: {between}"
    first_b = between.index(("draft", 0)) if ("draft", 0) in between else len(between)
    assert ("dropped", saved[0]) in between[:first_b], f"A's kept rows not dropped unfed before B drafts: {between}"
    assert all(kind != "fed" for kind, _ in between[:between.index(("dropped", saved[0]))]), between
    after = events[ends[1] + 1:ends[2]]  # C
    assert ("restored", saved[0]) in after, f"C did not restore A's kept rows: {after}"
    fed = [n for kind, n in after[after.index(("restored", saved[0])):] if kind == "fed"]
    c_new = answers["auto"][2].n_prompt - (len(answers["auto"][0].tokens) + answers["auto"][0].n_prompt)
    assert fed and fed[0] >= saved[0] + c_new, (fed, saved[0], c_new)


def test_draft_length_auto_prices_steps_wider_than_measured(llama_bin: Path, trained_pair: dict[str, Path],
                                                            tmp_path: Path):
    """Patch 0019: a step wider than any measured one costs the largest measured step plus the average
    cost of an added token between the smallest and the largest measured sizes, and the timings' verify
    curve reaches the widest step the slots can make (-np 2 x a full DFlash 2 block: 16 tokens). One
    request on two slots measures steps of 1..8 tokens only. Unpatched: the curve ends at the widest
    measured step, and the controller priced a wider one as that one (drafting beside other slots
    looked free)."""
    args = ["--parallel", "2", "-c", "2048", "-t", "1", "-md", trained_pair["dflash2"], "--spec-type", "draft-dflash",
            "--spec-draft-n-max", "auto"]
    with LlamaServer(trained_pair["target"], args, bin_dir=llama_bin, log_path=tmp_path / "auto.log") as server:
        timings = server.client.complete("Once upon a time", 48, ignore_eos=True).timings
    verify, draft = timings["draft_verify_cost_ms"], timings["draft_pass_cost_ms"]
    assert len(verify) == 2 * 8 and len(draft) == 2, (verify, draft)
    slope = (verify[7] - verify[0]) / 7  # sizes 1 and 8 are measured: the calibration's plain steps and full blocks
    assert slope > 0
    for size in range(9, 17):
        assert verify[size - 1] == pytest.approx(verify[7] + slope * (size - 8), rel=1e-3, abs=1e-3), (size, verify)


@pytest.mark.parametrize("n_max", ["3", "auto", None], ids=["static", "auto", "target-alone"])
def test_spec_time_says_where_the_generation_went(llama_bin: Path, trained_pair: dict[str, Path], n_max: str | None):
    """Patch 0020: with a drafter, the timings' spec_time_ms split the generation's time (predicted_ms)
    into the target's steps, draft passes, the drafter's feed and sampling, measured where each happens;
    what they leave out (host, batch building, the controller) is small on one slot. The target alone's
    timings are unchanged. Unpatched: no spec_time_ms."""
    args = ["--parallel", "1", "-c", "2048", "-t", "1"]
    if n_max is not None:
        args += ["-md", trained_pair["dflash2"], "--spec-type", "draft-dflash", "--spec-draft-n-max", n_max]
    with LlamaServer(trained_pair["target"], args, bin_dir=llama_bin) as server:
        server.client.complete("Once upon a time", 8, ignore_eos=True)  # auto calibrates on its first steps
        timings = server.client.complete("The little robot", 48, ignore_eos=True).timings
    if n_max is None:
        assert "spec_time_ms" not in timings, timings
        return
    parts = timings["spec_time_ms"]
    assert set(parts) == {"target", "draft", "feed", "sample"}, parts
    assert all(v >= 0 for v in parts.values()) and parts["target"] > 0, parts
    if n_max != "auto":
        assert parts["draft"] > 0 and parts["feed"] > 0, parts  # every step drafts and feeds the drafter
    total, generation = sum(parts.values()), timings["predicted_ms"]
    assert 0.8 * generation <= total <= generation + 0.5, (parts, generation)


def test_draft_length_auto_probes_a_new_request_and_together(llama_bin: Path, trained_pair: dict[str, Path],
                                                             tmp_path: Path):
    """Patch 0021: a parked slot probes at a new request's first step where that draft pass costs at most
    1 % of the plain steps the request may take (draft <= 0.01 x verify1 x tokens left: a 1500-token
    request, not a 16-token one); with two slots, a parked slot joins a draft pass the other slot makes
    in the same step, probing (`why=probe_join`) or drafting beside it where alone it would park
    (`why=ride`, logged right after that slot's drafting line), and a ride keeps its probe schedule.
    Unpatched: a new request waits out the probe schedule of the one before (its first step is a plain
    step), and a parked slot that drafted beside another's pass restarted its probes at every 8 steps."""
    from training.fixtures.trained_gguf import held_out_prompts

    prompts = held_out_prompts()
    auto = ["-md", trained_pair["dflash2"], "--spec-type", "draft-dflash", "--spec-draft-n-max", "auto", "-lv", "5"]
    one = tmp_path / "one.log"
    with LlamaServer(trained_pair["target"], ["--parallel", "1", "-c", "4096", "-t", "1", *auto],
                     bin_dir=llama_bin, log_path=one) as server:
        firsts = []
        for prompt, n in ((prompts[0], 480), (prompts[1], 16), (prompts[2], 1500)):
            before = len(AUTO_LINE.findall(one.read_text(errors="replace")))
            server.client.complete(prompt, n, ignore_eos=True)
            log = one.read_text(errors="replace")
            firsts.append((AUTO_LINE.findall(log)[before], AUTO_COSTS.findall(log)[before]))
    short, ((_, n, parked, _, _, why), (draft_ms, verify1_ms, _, _)) = firsts[1][0], firsts[2]
    assert short[5] != "probe_start", firsts[1]  # 16 tokens: a draft pass is far more than 1 % of them
    assert float(draft_ms) <= 0.01 * float(verify1_ms) * 1400, firsts[2]  # the trained pair on this CPU: ~5x
    assert (n, parked, why) == ("0", "1", "probe_start"), firsts[2]

    two = tmp_path / "two.log"
    with LlamaServer(trained_pair["target"], ["--parallel", "2", "-c", "4096", "-t", "1", *auto],
                     bin_dir=llama_bin, log_path=two) as server:
        answers = [None, None]

        def ask(i: int) -> None:
            answers[i] = server.client.complete(prompts[3 + i], 1200, ignore_eos=True)

        # the second request starts while the first is parked, so their probe schedules differ
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
        threads[0].start()
        deadline = time.monotonic() + 60
        while len(AUTO_LINE.findall(two.read_text(errors="replace"))) < 100 and time.monotonic() < deadline:
            time.sleep(0.05)
        threads[1].start()
        for t in threads:
            t.join()
    assert all(answers)
    lines = AUTO_LINE.findall(two.read_text(errors="replace"))
    joins = [i for i, d in enumerate(lines) if d[5] in ("ride", "probe_join")]
    assert joins, "no parked slot joined another slot's draft pass"
    for i in joins:
        other = lines[i - 1]  # the step's decision just before, by the other slot: a draft pass (it drafts or probes)
        assert other[0] != lines[i][0] and (int(other[1]) > 0 or other[5].startswith("probe")), (lines[i - 1], lines[i])
        # a ride keeps the parked slot's schedule, doubled as by a probe: a scheduled probe next is at least 16
        # steps on (restarting the schedule would probe at the 8th)
        mine = [d for d in lines[i + 1:] if d[0] == lines[i][0]]
        passes = [k for k, d in enumerate(mine) if int(d[1]) > 0 or d[5].startswith("probe")]
        if lines[i][5] == "ride" and passes and mine[passes[0]][5] == "probe":
            assert passes[0] >= 15, (lines[i], passes[0])


AUTO_CREDIT = re.compile(r"spec auto: slot=0 .* why=(\w+) draft_ms=(-?[\d.]+) verify1_ms=(-?[\d.]+) .* credit=([\d.]+)")


def test_draft_length_auto_probes_from_an_earned_budget(llama_bin: Path, trained_pair: dict[str, Path], tmp_path: Path):
    """Patch 0022: a parked slot's probes are paid from a budget it earns, 1 / cap of a probe per step
    (cap = ceil(draft / (0.01 x verify1)) from 8 to 1024, 0014's wait), starting at none: a slot parked
    from the start-up on probes about once per cap steps, not at 8, 24, 56, 120, 248 steps as 0014's
    doubling from 8 did; each decision line ends with the credit, between 0 and 2 probes. Unpatched: no
    `credit=` on the line, and 5 probes where the budget earned about one. The text: random hexadecimal
    digits, of which the drafter predicts nothing, so the slot parks throughout."""
    rng = random.Random(0)
    hex_digits = " ".join(f"{rng.getrandbits(32):08x}" for _ in range(40))
    args = ["--parallel", "1", "-c", "1024", "-t", "1", "-md", trained_pair["dflash2"], "--spec-type", "draft-dflash",
            "--spec-draft-n-max", "auto", "-lv", "5"]
    with LlamaServer(trained_pair["target"], args, bin_dir=llama_bin, log_path=tmp_path / "auto.log") as server:
        server.client.complete(hex_digits, 480, ignore_eos=True)
    log = (tmp_path / "auto.log").read_text(errors="replace")
    lines = AUTO_CREDIT.findall(log)
    decided = [d for d in AUTO_LINE.findall(log) if d[5] != "limit"]  # `limit`: no room for a draft, no choice
    assert len(lines) == len(decided) > 400, "one decision line per step, each with its credit"
    after = [(why, float(d), float(v), float(c)) for why, d, v, c in lines[6:]]  # after the start-up calibration
    assert all(0.0 <= c <= 2.0 for *_, c in after), sorted({c for *_, c in after})[-3:]
    caps = [min(1024, max(8, math.ceil(d / (0.01 * v)))) for _, d, v, _ in after]
    earned = sum(1.0 / cap for cap in caps)
    probes = [i for i, (why, *_) in enumerate(after) if why in ("probe", "probe_start")]
    assert len(probes) <= earned + 1, f"{len(probes)} probes at steps {probes}, {earned:.2f} earned (caps {min(caps)}-{max(caps)})"
    if probes:  # the first one waits for most of a probe's worth: the cap, less what its costs moved
        assert probes[0] + 1 >= min(caps[:probes[0] + 1]) / 2, (probes, caps[:probes[0] + 1])


AUTO_BLOCK = re.compile(r"spec auto: slot=0 n=(\d+) .* credit=[\d.]+ E_block=([\d.]+)")
DRAFT_ACCEPTED = re.compile(r"accepted (\d+)/(\d+) draft tokens")


def _shrunk_block(accepted: int, block: int) -> float:
    """0023's expected tokens of a whole block after one scored block accepted to depth `accepted`: depth k's
    rate is (its count + depth k-1's rate) / (its offers + 1), depth 1's shrunk toward 0.5; depths 1..accepted
    seen accepted once, the next one rejected once, the deeper ones never offered."""
    e, p, rate = 1.0, 1.0, 0.5
    for depth in range(1, block + 1):
        seen, taken = (1, 1) if depth <= accepted else (1, 0) if depth == accepted + 1 else (0, 0)
        rate = (taken + rate) / (seen + 1)
        p *= rate
        e += p
    return e


def test_draft_length_auto_deep_depths_lean_on_the_shallower(llama_bin: Path, trained_pair: dict[str, Path],
                                                             tmp_path: Path):
    """Patch 0023: a depth's acceptance rate is its own counts shrunk toward the rate of the depth above it, so a
    slot whose whole block was just accepted expects most of a block at once: 5.37 tokens of DFlash 2's 8 after
    the first calibration block of held-out prompt 0 (accepted whole), where 0008's fixed prior of 0.5 at
    every depth made it 3.60 (0.75 a depth, multiplied down). The decision line ends `E_block=` (what a whole
    block is expected to give); unpatched it has none."""
    from training.fixtures.trained_gguf import held_out_prompts

    args = ["--parallel", "1", "-c", "1024", "-t", "1", "-md", trained_pair["dflash2"], "--spec-type", "draft-dflash",
            "--spec-draft-n-max", "auto", "-lv", "5"]
    with LlamaServer(trained_pair["target"], args, bin_dir=llama_bin, log_path=tmp_path / "auto.log") as server:
        server.client.complete(held_out_prompts()[0], 32, ignore_eos=True)
    log = (tmp_path / "auto.log").read_text(errors="replace")
    decisions = [(int(n), float(e)) for n, e in AUTO_BLOCK.findall(log)]
    assert len(decisions) >= 2, log[-1500:]
    (first_n, first_e), (_, second_e) = decisions[:2]
    accepted, block = map(int, DRAFT_ACCEPTED.findall(log)[0])
    assert first_n == block == 7, decisions[:2]  # the start-up calibration verifies the whole block
    assert first_e == pytest.approx(1 + sum(0.5 ** k for k in range(1, 8)), abs=2e-3)  # nothing seen yet: 0.5 a depth
    assert accepted >= 4, f"held-out prompt 0's first block accepted to {accepted} only"
    assert second_e == pytest.approx(_shrunk_block(accepted, block), abs=2e-3), (accepted, decisions[:3])


AUTO_SCORED = re.compile(r"spec auto scored: slot=0 i0=(\d+) accepted=(\d+)")


def test_draft_length_auto_counts_each_stretch_by_its_tokens(llama_bin: Path, trained_pair: dict[str, Path],
                                                             tmp_path: Path):
    """Patch 0024: every auto response's timings carry `draft_full_tokens_by_accepted[L]`, the request's tokens by
    the accepted length L of the scored whole block whose stretch they are in (from the block's position to the
    next scored block's), so a probe stands for its whole parked stretch; validation/acceptance.py's limit
    serves each stretch at its best length. One slot, 480 tokens that mostly park: every token from the first
    block's on is counted once, each stretch the log closes (`spec auto scored:` lines, -lv 5) at its block's
    length, and the calibration's blocks (verified whole) at the length the target accepted. Unpatched: no
    such field and no scored lines."""
    from training.fixtures.trained_gguf import held_out_prompts

    args = ["--parallel", "1", "-c", "1024", "-t", "1", "-md", trained_pair["dflash2"], "--spec-type", "draft-dflash",
            "--spec-draft-n-max", "auto", "-lv", "5"]
    with LlamaServer(trained_pair["target"], args, bin_dir=llama_bin, log_path=tmp_path / "auto.log") as server:
        answer = server.client.complete(held_out_prompts()[1], 480, ignore_eos=True)
    log = (tmp_path / "auto.log").read_text(errors="replace")
    by_accepted = answer.timings["draft_full_tokens_by_accepted"]
    scored = sorted((int(i0), int(a)) for i0, a in AUTO_SCORED.findall(log))
    assert len(scored) >= 5 and scored[0][0] == 1, scored[:6]  # the first block is drafted after the prompt's token
    assert sum(by_accepted) == answer.n_predicted - scored[0][0], (by_accepted, answer.n_predicted)
    closed: Counter[int] = Counter()
    stretches = []
    for (i0, a), (nxt, _) in zip(scored, scored[1:]):
        closed[a] += nxt - i0
        stretches.append(nxt - i0)
    assert all(by_accepted[a] >= n for a, n in closed.items()), (by_accepted, closed)
    assert sum(by_accepted) - sum(closed.values()) <= answer.n_predicted - scored[-1][0]
    stretches.append(answer.n_predicted - scored[-1][0])
    assert max(stretches) > 8 * 8, f"no parked stretch counted whole: {stretches}"  # many plain steps, one block
    for (i0, a), (verified, n) in zip(scored[:4], DRAFT_ACCEPTED.findall(log)[:4]):
        assert int(n) == 7 and (a == int(verified)), (scored[:4], DRAFT_ACCEPTED.findall(log)[:4])


# 0025's decision line at a request's first step; `opening=-` at the others
AUTO_OPENING = re.compile(r"task (\d+) \| spec auto: slot=0 n=\d+ .* E_block=([\d.]+) "
                          r"opening=(?:-|([\d.]+)/([\d.]+) carried=([\d.]+))")
AUTO_SCORED_TASK = re.compile(r"task (\d+) \| spec auto scored: slot=0 i0=(\d+) accepted=(\d+)")


def test_draft_length_auto_opens_a_request_from_the_openings(llama_bin: Path, trained_pair: dict[str, Path],
                                                              tmp_path: Path):
    """Patch 0025: a request's first step drafts after the prompt alone, and decides by what earlier requests'
    first blocks met, not by the counts carried from the last request's end: there depth k's rate is the
    earlier openings' counts (halved every 4 requests) shrunk toward the opening's depth k-1, depth 1's toward
    the depth-1 rate the slot carried in. One slot, six held-out requests of 480 tokens (long enough that each
    is probed at its first step, 0021, where a draft pass costs up to 4.8 plain steps): a request's first decision logs `opening=<accepted>/<offered>
    carried=<rate>` (depth 1), every later one `opening=-`; the counts are the earlier first blocks as the
    `spec auto scored:` lines score them, and E_block the whole block at the openings' rates. Unpatched: no
    `opening=`."""
    from training.fixtures.trained_gguf import held_out_prompts

    args = ["--parallel", "1", "-c", "2048", "-t", "1", "-md", trained_pair["dflash2"], "--spec-type", "draft-dflash",
            "--spec-draft-n-max", "auto", "-lv", "5"]
    with LlamaServer(trained_pair["target"], args, bin_dir=llama_bin, log_path=tmp_path / "auto.log") as server:
        for prompt in held_out_prompts()[:6]:
            server.client.complete(prompt, 480, ignore_eos=True)
    log = (tmp_path / "auto.log").read_text(errors="replace")
    decisions: dict[int, list[tuple]] = {}
    for task, e_block, acc, off, carried in AUTO_OPENING.findall(log):
        decisions.setdefault(int(task), []).append((float(e_block), acc and (float(acc), float(off), float(carried))))
    openings: dict[int, list[int]] = {}  # each request's first block (drafted after the prompt's token) by its accepted length
    for task, i0, accepted in AUTO_SCORED_TASK.findall(log):
        if int(i0) == 1:
            openings.setdefault(int(task), []).append(int(accepted))
    assert len(decisions) == 6 and len(openings) >= 2, (sorted(decisions), openings)
    block = 7
    counts = [[0.0, 0.0] for _ in range(block)]  # per depth: accepted, offered
    for task in sorted(decisions):
        steps = decisions[task]
        assert steps[0][1] and not any(opening for _, opening in steps[1:]), steps[:3]
        e_block, (acc, off, carried) = steps[0]
        assert (acc, off) == (pytest.approx(counts[0][0], abs=2e-3), pytest.approx(counts[0][1], abs=2e-3)), task
        e, p, rate = 1.0, 1.0, carried
        for taken, seen in counts:
            rate = (taken + rate) / (seen + 1)
            p *= rate
            e += p
        assert e_block == pytest.approx(e, abs=2e-3), (task, steps[0], counts)
        counts = [[c * 0.5 ** 0.25 for c in depth] for depth in counts]
        for accepted in openings.get(task, []):
            for depth in range(min(accepted + 1, block)):
                counts[depth][1] += 1
                counts[depth][0] += depth < accepted


# 0026's decision line: the price of the slot's feed now and the rows it keeps, after 0025's `opening=`
AUTO_FEED = re.compile(r"spec auto: slot=0 n=\d+ parked=[01] .* why=(\w+) draft_ms=(-?[\d.]+) verify1_ms=(-?[\d.]+) .* "
                       r"credit=([\d.]+) .* feed_ms=([\d.]+) kept=(\d+)")
DRAFTER_FED = re.compile(r"dflash kept: seq_id=0 fed=(\d+)")


def test_draft_length_auto_prices_a_probe_with_its_feed(llama_bin: Path, trained_pair: dict[str, Path], tmp_path: Path):
    """Patch 0026: a parked slot's probe is priced with the feed of the rows it kept (fed to the drafter before
    the probe's pass), not at the draft pass alone: once a feed has been timed, each decision line prices the
    kept rows at the feeds' rate (`feed_ms=`, proportional to `kept=` between feeds), and a parked step earns
    1 / cap of a probe with cap = ceil((draft + feed) / (0.01 x verify1)) from 8 to 1024 (0022's budget), so
    the credit grows more slowly the more the slot keeps. Unpatched: no `feed_ms=` on the line, and the
    credit grows by the draft pass's share alone. The text: random hexadecimal digits, parked throughout."""
    rng = random.Random(0)
    hex_digits = " ".join(f"{rng.getrandbits(32):08x}" for _ in range(40))
    args = ["--parallel", "1", "-c", "1024", "-t", "1", "-md", trained_pair["dflash2"], "--spec-type", "draft-dflash",
            "--spec-draft-n-max", "auto", "-lv", "5"]
    with LlamaServer(trained_pair["target"], args, bin_dir=llama_bin, log_path=tmp_path / "auto.log") as server:
        server.client.complete(hex_digits, 480, ignore_eos=True)
    log = (tmp_path / "auto.log").read_text(errors="replace")
    decided = [d for d in AUTO_LINE.findall(log) if d[5] != "limit"]
    lines = [(why, float(d), float(v), float(c), float(f), int(k)) for why, d, v, c, f, k in AUTO_FEED.findall(log)]
    assert len(lines) == len(decided) > 400, "one decision line per step, each with the feed's price"
    fed = [int(n) for n in DRAFTER_FED.findall(log)]
    assert any(n > 1 for n in fed), f"no feed of kept rows: {fed}"

    # after the first line that prices a feed, the price is the kept rows at one rate until the next feed
    priced = [i for i, line in enumerate(lines) if line[4] > 0.0]
    assert priced and all(lines[i][5] > 0 for i in priced), "a price for rows kept, none for none"
    first = priced[0]
    assert all(line[4] > 0.0 for line in lines[first:] if line[5] >= 20), "every later line with rows kept prices them"
    stretches, rates = [], []  # a feed empties what the slot keeps: the rate may move there, not between
    for prev, line in zip(lines[first - 1:], lines[first:]):
        if line[5] < prev[5] and rates:
            stretches.append(rates)
            rates = []
        if line[5] >= 100:
            rates.append(line[4] / line[5])
    stretches = [r for r in stretches + [rates] if r]
    assert stretches and all(max(r) <= 1.01 * min(r) + 1e-4 for r in stretches), [(min(r), max(r)) for r in stretches]

    def cap(draft: float, feed: float, verify1: float) -> int:
        return min(1024, max(8, math.ceil((draft + feed) / (0.01 * verify1))))

    # the credit over a run of parked steps (no probe, below the saving cap of 2) grows by 1 / cap a step
    with_feed, without_feed, grown, k = 0.0, 0.0, 0.0, max(first, 6)
    for prev, line in zip(lines[k:], lines[k + 1:]):
        why, draft, verify1, credit, feed, _ = line
        if why != "rate" or credit >= 1.9 or credit < prev[3]:
            continue
        grown += credit - prev[3]
        with_feed += 1.0 / cap(draft, feed, verify1)
        without_feed += 1.0 / cap(draft, 0.0, verify1)
    assert grown > 0.05, f"too little credit earned after the first feed ({grown:.3f}) to tell the prices apart"
    assert grown == pytest.approx(with_feed, rel=0.05, abs=0.01), (grown, with_feed, without_feed)
    assert without_feed > 1.2 * with_feed, f"the feed is not a visible share of a probe here: {with_feed:.3f} {without_feed:.3f}"


# 0027: a decision line, or the line logged where p_min keeps less of a drafted block than its whole
AUTO_OR_P_MIN = re.compile(r"spec auto: slot=0 n=\d+ parked=[01] E=[\d.]+ cost_ms=[\d.]+ why=(\w+)"
                           r"|spec auto p_min: slot=0 i0=(\d+) n=(\d+) confident=(\d+) verify=(\d+)")
CALIBRATION_VERIFY = re.compile(AUTO_LINE.pattern + r"|spec auto cost: verify size=(\d+)")
P_MIN_0027 = "0.999"  # the trained DFlash 2 is sure of its blocks: 0.9 cut one block in two requests, 0.999 cuts most


def test_draft_length_auto_with_p_min_calibrates_on_whole_blocks(llama_bin: Path, trained_pair: dict[str, Path],
                                                                 tmp_path: Path):
    """Patch 0027: with `--spec-draft-p-min`, auto's start-up calibration verifies its 4 blocks whole, whatever
    p_min keeps of them, so the full verify batch is priced by the least of 4 samples (0015), not by one cold
    one, and those blocks are scored whole; after it p_min cuts the blocks as before (a `spec auto p_min:` line
    where it keeps less than the slot chose); the tokens are the target alone's. Unpatched: p_min cut the
    calibration's blocks (the full batch priced by one sample: a server could start parked), no such line."""
    from training.fixtures.trained_gguf import held_out_prompts

    prompts = held_out_prompts()[:2]
    common = ["--parallel", "1", "-c", "1024", "-t", "1"]
    auto = ["-md", trained_pair["dflash2"], "--spec-type", "draft-dflash", "--spec-draft-n-max", "auto",
            "--spec-draft-p-min", P_MIN_0027, "-lv", "5"]
    runs: dict[str, list] = {}
    for name, args in (("alone", common), ("auto", common + auto)):
        with LlamaServer(trained_pair["target"], args, bin_dir=llama_bin, log_path=tmp_path / f"{name}.log") as server:
            runs[name] = [server.client.complete(p, 96, ignore_eos=True) for p in prompts]
    for alone, answer in zip(runs["alone"], runs["auto"]):
        assert answer.tokens == alone.tokens
    log = (tmp_path / "auto.log").read_text(errors="replace")

    # each step's decision line, then its verify batch's cost line: the calibration's 4 drafting steps verify 8 tokens
    sizes, calibrating_now = [], False
    for _, n, _, _, _, why, size in CALIBRATION_VERIFY.findall(log):
        if why:
            calibrating_now = why == "calibrate" and n == "7"
        elif calibrating_now:
            sizes.append(int(size))
            calibrating_now = False
    assert sizes == [8, 8, 8, 8], f"the calibration's verify batches, 1 token and 7 drafted each: {sizes}"

    def trims(text: str) -> list[tuple[str, int, int, int, int]]:
        found, why = [], ""
        for reason, i0, n, confident, verify in AUTO_OR_P_MIN.findall(text):
            if reason:
                why = reason
            else:
                found.append((why, int(i0), int(n), int(confident), int(verify)))
        return found

    calibrating = [t for t in trims(log) if t[0] == "calibrate"]
    assert calibrating, f"p_min {P_MIN_0027} kept every calibration block whole: nothing to tell apart"
    assert all(verify == n == 7 for _, _, n, _, verify in calibrating), calibrating
    later = [t for t in trims(log) if t[0] != "calibrate"]
    assert later and all(verify == confident < n for _, _, n, confident, verify in later), later[:8]
    # scored as verified: a calibration block past its confident prefix, the later ones within it (request by
    # request: a slot's i0 restarts at each)
    whole, cut = [], []
    for request in log.split("stop processing"):
        scored = {int(i0): int(a) for i0, a in AUTO_SCORED.findall(request)}
        for why, i0, _, confident, _ in trims(request):
            if i0 in scored:
                (whole if why == "calibrate" else cut).append((scored[i0], confident))
    assert any(a > c for a, c in whole) and cut and all(a <= c for a, c in cut), (whole, cut)


@pytest.mark.parametrize("extra", [(), ("-md", "DRAFTER", "--spec-type", "ngram-simple")],
                         ids=["no-drafter", "ngram"])
def test_draft_length_auto_without_block_drafter_is_refused(llama_bin: Path, trained_pair: dict[str, Path],
                                                             extra: tuple[str, ...]):
    """auto needs a DFlash / DSpark drafter: without one, one error line and exit status 2, before
    anything is loaded (unpatched: "auto" is an invalid value, exit status 1)."""
    args = [trained_pair["dflash2"] if a == "DRAFTER" else a for a in extra]
    proc = run_tool(llama_bin, "llama-server", "-m", trained_pair["target"], *args, "--spec-draft-n-max", "auto",
                    "--host", "127.0.0.1", "--port", str(free_port()), "-t", "1", timeout=30)
    log = proc.stdout + proc.stderr
    lines = [line for line in log.splitlines() if "--spec-draft-n-max auto" in line]
    assert proc.returncode == 2, f"exit status {proc.returncode}:\n{log[-1500:]}"
    assert len(lines) == 1 and " E " in lines[0], log[-1500:]


# ---------------------------------------------------------------------------------------------
# 0009-spec-tree-verify
# ---------------------------------------------------------------------------------------------

TREE_LINE = re.compile(r"spec tree: slot=(\d+) pos=(\d+) last=(\d+) n=(\d+) tokens=\[([\d,]*)\] parents=\[([\d,]*)\]")
TREE_ACCEPTED = re.compile(r"spec tree accepted: slot=(\d+) path=\[([\d,]*)\]")
TREE_COMMON = ("--parallel", "1", "-c", "2048", "-t", "1")
# batch-invariant kernels (patch 0007, what --exact sets): a token's logits and layer inputs do not depend on
# the batch it was verified in, so tree, chain and target alone are compared bit for bit
TREE_ENV = {"GGML_CPU_USE_REF": "1"}


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t]


def _tree_steps(log: str) -> list[tuple[int, int, list[int], list[int], list[int]]]:
    """(pos, last, tokens, parents, accepted path) per tree step, checked for shape: parents come first,
    the accepted path descends from the root."""
    trees, paths = TREE_LINE.findall(log), TREE_ACCEPTED.findall(log)
    assert len(trees) == len(paths) > 0, (len(trees), len(paths))
    steps = []
    for (slot, pos, last, n, toks, pars), (slot_acc, path) in zip(trees, paths):
        tokens, parents, path = _ints(toks), _ints(pars), _ints(path)
        assert slot == slot_acc and len(tokens) == len(parents) == int(n) > 0
        assert all(0 <= p < j for j, p in enumerate(parents, start=1)), parents
        assert all(parents[j - 1] == (path[i - 1] if i else 0) for i, j in enumerate(path)), (parents, path)
        steps.append((int(pos), int(last), tokens, parents, path))
    return steps


def _requests(log: str) -> list[str]:
    """The server log cut at the end of each request (one slot: requests do not overlap)."""
    return log.split("stop processing:")[:-1]


def _tau(answers) -> float:
    """Tokens per verifying target step: 1 + accepted draft tokens per step that verified a draft."""
    steps = sum(sum(a.timings["draft_n_chosen_hist"][1:]) for a in answers)
    return 1 + sum(a.draft_n_accepted for a in answers) / max(1, steps)


@pytest.mark.parametrize("drafter", ["dflash2", "dflash"])
def test_tree_verify_is_the_targets_own_and_accepts_more(llama_bin: Path, smollm2: dict[str, Path], drafter: str,
                                                         tmp_path: Path):
    """`--spec-tree-budget N` verifies a best-first draft tree in one target batch: on SmolLM2 F16 with its
    DFlash 2 and DFlash drafters the output is the target alone's, token for token; every step's tree and
    accepted path are logged and add up to the response's draft counts; more tokens are accepted per step
    than with the chain; and the drafter after a tree step is the one the chain leaves (every draft made at
    the same position after the same token is identical). Unpatched: unknown argument, exit 1."""
    from training.fixtures.smollm2 import EVAL_PROMPTS

    chats = [json.loads(line)["messages"] for line in EVAL_PROMPTS.read_text(encoding="utf-8").splitlines()[:3]]
    spec = ["-md", smollm2[drafter], "--spec-type", "draft-dflash", "--spec-draft-n-max", "15"]
    configs = {"alone": [], "chain7": spec[:-1] + ["7", "-lv", "5"], "chain15": spec + ["-lv", "5"],
               "tree8": spec + ["--spec-tree-budget", "8", "-lv", "5"],
               "tree16": spec + ["--spec-tree-budget", "16", "-lv", "5"]}
    runs, logs = {}, {}
    for name, args in configs.items():
        log_path = tmp_path / f"{name}.log"
        with LlamaServer(smollm2["F16"], [*TREE_COMMON, *args], bin_dir=llama_bin, log_path=log_path,
                         env=TREE_ENV) as server:
            prompts = [server.client.apply_template(m) for m in chats]
            runs[name] = [server.client.complete(p, 64, ignore_eos=True) for p in prompts]
        logs[name] = log_path.read_text(errors="replace")

    for name, answers in runs.items():
        for i, answer in enumerate(answers):
            assert answer.tokens == runs["alone"][i].tokens, f"{name}, prompt {i}: not the target's own tokens"

    for budget in (8, 16):
        answers, log = runs[f"tree{budget}"], logs[f"tree{budget}"]
        assert f"spec tree: budget={budget} n_seq_max={1 + budget} kv_unified=1" in log
        steps = _tree_steps(log)
        assert all(len(tokens) <= budget for _, _, tokens, _, _ in steps)
        assert sum(len(t) for _, _, t, _, _ in steps) == sum(a.draft_n for a in answers)
        assert sum(len(path) for *_, path in steps) == sum(a.draft_n_accepted for a in answers)
        assert all(a.timings["draft_tree_budget"] == budget for a in answers)
        accepted = sum(a.draft_n_accepted for a in answers)
        assert sum(sum(a.timings["draft_accepted_per_depth"]) for a in answers) == accepted
        # the first node popped is the root's best child: the chain's first token
        for request in _requests(log):
            chain_first = {(d.pos, d.id_last): d.ids[0] for d in parse_drafts(request)}
            assert all(int(t.split(",")[0]) == chain_first[(int(pos), int(last))]
                       for _, pos, last, _, t, _ in TREE_LINE.findall(request))
    assert all(a.timings["draft_tree_budget"] == 0 for a in runs["chain15"])

    # the drafter after tree steps is the one the chain leaves: the same drafts wherever both drafted at the
    # same point, bit for bit. Patch 0010 moves an accepted path whose nodes were not the first in the batch
    # next to the root, so the target's KV cells stay in position order and its layer inputs, which the
    # drafter reads, are the chain's; without it they differ in the last bits after such a step
    for name in ("tree8", "tree16"):
        common = 0
        for chain_req, tree_req in zip(_requests(logs["chain15"]), _requests(logs[name])):
            chain = {(d.pos, d.id_last): d.ids for d in parse_drafts(chain_req)}
            tree = {(d.pos, d.id_last): d.ids for d in parse_drafts(tree_req)}
            for key in set(chain) & set(tree):
                assert chain[key] == tree[key], f"{name}: the drafter differs at {key}"
                common += 1
        assert common >= 6, (name, common)
        moved = [path for *_, path in _tree_steps(logs[name]) if path != list(range(1, len(path) + 1))]
        assert moved, f"{name}: no accepted path was out of batch order, so nothing was moved"

    tau = {name: _tau(runs[name]) for name in runs if name != "alone"}
    print(f"{drafter}: tokens per target step " + ", ".join(f"{k} {v:.3f}" for k, v in tau.items()))
    assert tau["tree8"] >= tau["chain7"] and tau["tree16"] >= tau["chain15"], tau


@pytest.mark.parametrize("pair, drafter, chain, goal", [("smollm2", "dflash2", 7, 1.25), ("trained", "dflash", 15, 1.15)],
                         ids=["smollm2-dflash2", "trained-dflash"])
def test_tree_node_probabilities_reach_the_goals(llama_bin: Path, smollm2: dict[str, Path], trained_pair: dict[str, Path],
                                                 pair: str, drafter: str, chain: int, goal: float):
    """The tree's node probabilities decide where its 16 nodes go: on SmolLM2's 8 held-out chat prompts
    (DFlash 2, against the 7-token chain) and the trained pair's 8 held-out prompts (DFlash, against the
    15-token chain) it accepts at least the issue's 1.25x and 1.15x the chain's tokens per step, and every
    token is the chain's. With 0009's first probabilities (DFlash 2's selector softmax at temperature 1,
    DFlash's top 10 renormalised) it accepted 1.246x and 1.125x here. Unpatched: unknown argument."""
    from training.fixtures.smollm2 import EVAL_PROMPTS

    files = smollm2 if pair == "smollm2" else trained_pair
    target = files["F16"] if pair == "smollm2" else files["target"]
    if pair == "smollm2":
        prompts = [json.loads(line)["messages"] for line in EVAL_PROMPTS.read_text(encoding="utf-8").splitlines()[:8]]
    else:
        prompts = read_prompts(files["prompts"])[:8]
    spec = ["-md", files[drafter], "--spec-type", "draft-dflash", "--spec-draft-n-max", str(chain)]
    runs = {}
    for name, args in (("chain", spec), ("tree", spec + ["--spec-tree-budget", "16"])):
        with LlamaServer(target, [*TREE_COMMON, *args], bin_dir=llama_bin, env=TREE_ENV) as server:
            texts = [server.client.apply_template(p) if pair == "smollm2" else p for p in prompts]
            runs[name] = [server.client.complete(t, 64) for t in texts]
    assert [a.tokens for a in runs["tree"]] == [a.tokens for a in runs["chain"]]
    ratio = _tau(runs["tree"]) / _tau(runs["chain"])
    print(f"{pair} {drafter}: tree 16 over chain {chain}: {ratio:.3f}")
    assert ratio >= goal, ratio


def test_tree_serves_greedy_requests_only(llama_bin: Path, smollm2: dict[str, Path], tmp_path: Path):
    """A request at temperature > 0 is verified by the chain (the walk down a tree takes the target's own
    greedy tokens): the server says so for the task, and its timings say draft_tree_budget 0."""
    args = [*TREE_COMMON, "-md", smollm2["dflash2"], "--spec-type", "draft-dflash", "--spec-tree-budget", "8",
            "-lv", "5"]
    log_path = tmp_path / "server.log"
    with LlamaServer(smollm2["F16"], args, bin_dir=llama_bin, log_path=log_path) as server:
        sampled = server.client.complete(PROMPT, 24, temperature=0.8, seed=1, ignore_eos=True)
        n_trees = len(TREE_LINE.findall(log_path.read_text(errors="replace")))
        greedy = server.client.complete(PROMPT, 24, ignore_eos=True)
    log = log_path.read_text(errors="replace")
    assert "spec tree: greedy requests; temperature > 0 verifies the chain" in log
    assert len(re.findall(r"spec tree: chain for task \d+: ", log)) == 1
    assert n_trees == 0 and sampled.draft_n > 0 and sampled.timings["draft_tree_budget"] == 0
    assert greedy.timings["draft_tree_budget"] == 8 and TREE_LINE.search(log)


@pytest.mark.parametrize("args, says", [
    (("--spec-tree-budget", "-1"), "--spec-tree-budget -1: a node budget is 0"),
    (("--spec-tree-budget", "8", "--spec-draft-n-max", "auto"), "cannot be combined; choose one"),
    (("--spec-tree-budget", "8", "--spec-type", "ngram-simple"), "needs a DFlash or DFlash 2 drafter"),
    (("--spec-tree-budget", "16", "-b", "16"), "use a budget of at most 15"),
    (("--spec-tree-budget", "16", "-c", "12"), "use a budget of at most 11"),
    (("--spec-tree-budget", "64", "--parallel", "4"), "use a budget of at most 63"),
], ids=["negative", "auto", "no-dflash", "batch", "context", "sequences"])
def test_tree_budget_refusals(llama_bin: Path, smollm2: dict[str, Path], args: tuple[str, ...], says: str):
    """A budget the server cannot serve: one error line naming the fix, exit status 2, nothing loaded."""
    drafter = () if "ngram-simple" in args else ("-md", smollm2["dflash2"], "--spec-type", "draft-dflash")
    proc = run_tool(llama_bin, "llama-server", "-m", smollm2["F16"], *drafter, *args,
                    "--host", "127.0.0.1", "--port", str(free_port()), "-t", "1", timeout=60)
    log = proc.stdout + proc.stderr
    lines = [line for line in log.splitlines() if "--spec-tree-budget" in line]
    assert proc.returncode == 2, f"exit status {proc.returncode}:\n{log[-1500:]}"
    assert len(lines) == 1 and " E " in lines[0] and says in lines[0], log[-1500:]


# ---------------------------------------------------------------------------------------------
# 0017-spec-tree-p-min
# ---------------------------------------------------------------------------------------------

def test_tree_floor_verifies_fewer_nodes(llama_bin: Path, smollm2: dict[str, Path], tmp_path: Path):
    """`--spec-tree-p-min P` stops a draft tree where the best path left is below P: on SmolLM2 F16 with its
    DFlash drafter a 16-node tree at floor 0.2 verifies fewer nodes than without, in steps of different sizes,
    some with no node at all (a plain target step); the tokens stay the target alone's. Unpatched (0009
    alone): unknown argument."""
    from training.fixtures.smollm2 import EVAL_PROMPTS

    chats = [json.loads(line)["messages"] for line in EVAL_PROMPTS.read_text(encoding="utf-8").splitlines()[:3]]
    spec = ["-md", smollm2["dflash"], "--spec-type", "draft-dflash", "--spec-draft-n-max", "15",
            "--spec-tree-budget", "16", "-lv", "5"]
    runs, logs = {}, {}
    for name, args in (("alone", []), ("tree", spec), ("floor", spec + ["--spec-tree-p-min", "0.2"])):
        log_path = tmp_path / f"{name}.log"
        with LlamaServer(smollm2["F16"], [*TREE_COMMON, *args], bin_dir=llama_bin, log_path=log_path,
                         env=TREE_ENV) as server:
            prompts = [server.client.apply_template(m) for m in chats]
            runs[name] = [server.client.complete(p, 64, ignore_eos=True) for p in prompts]
        logs[name] = log_path.read_text(errors="replace")
    for name in ("tree", "floor"):
        assert [a.tokens for a in runs[name]] == [a.tokens for a in runs["alone"]], name
    assert "spec tree: p_min=0.2: no node whose path probability is below it" in logs["floor"]
    assert "spec tree: p_min=" not in logs["tree"]

    sizes = [len(tokens) for _, _, tokens, _, _ in _tree_steps(logs["floor"])]
    assert sum(sizes) == sum(a.draft_n for a in runs["floor"])
    empty = sum(a.timings["draft_n_chosen_hist"][0] for a in runs["floor"])
    steps = {name: sum(sum(a.timings["draft_n_chosen_hist"]) for a in runs[name]) for name in ("tree", "floor")}
    per_step = {name: sum(a.draft_n for a in runs[name]) / steps[name] for name in steps}
    print(f"nodes per step: {per_step}; floor: {empty} steps without a node, tree sizes {sorted(set(sizes))}")
    assert max(len(t) for _, _, t, _, _ in _tree_steps(logs["tree"])) == 16
    assert per_step["floor"] < 0.75 * per_step["tree"], per_step
    assert len(set(sizes)) >= 3 and empty > 0, (sorted(set(sizes)), empty)


@pytest.mark.parametrize("args, says", [
    (("--spec-tree-budget", "8", "--spec-tree-p-min", "1"), "--spec-tree-p-min 1: a path probability floor"),
    (("--spec-tree-budget", "8", "--spec-tree-p-min", "-0.1"), "--spec-tree-p-min -0.1: a path probability floor"),
    (("--spec-tree-budget", "8", "--spec-tree-p-min", "nan"), "a path probability floor is at least 0"),
    (("--spec-tree-p-min", "0.2",), "--spec-tree-p-min needs --spec-tree-budget N"),
], ids=["one", "negative", "nan", "no-tree"])
def test_tree_floor_refusals(llama_bin: Path, smollm2: dict[str, Path], args: tuple[str, ...], says: str):
    """A floor the server cannot use: one error line naming the fix, exit status 2, nothing loaded."""
    proc = run_tool(llama_bin, "llama-server", "-m", smollm2["F16"], "-md", smollm2["dflash"], "--spec-type",
                    "draft-dflash", *args, "--host", "127.0.0.1", "--port", str(free_port()), "-t", "1", timeout=60)
    log = proc.stdout + proc.stderr
    lines = [line for line in log.splitlines() if "--spec-tree-p-min" in line]
    assert proc.returncode == 2, f"exit status {proc.returncode}:\n{log[-1500:]}"
    assert len(lines) == 1 and " E " in lines[0] and says in lines[0], log[-1500:]


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_tree_is_off_on_a_recurrent_target(llama_bin: Path, family, arch: str, tmp_path: Path):
    """A recurrent or hybrid target keeps one state per sequence, not one per branch of a tree: the server
    says at start-up that the chain verifies, and serves the target alone's tokens."""
    folder = family(arch)
    prompt = (folder / "prompts.txt").read_text().splitlines()[0]
    common = ["--parallel", "1", "-c", "1024", "-t", "1"]
    spec = ["-md", folder / "dflash2.gguf", "--spec-type", "draft-dflash", "--spec-tree-budget", "8"]
    answers, log_path = {}, tmp_path / "tree.log"
    for name, args in (("alone", common), ("tree", common + spec)):
        with LlamaServer(folder / "target-F16.gguf", args, bin_dir=llama_bin, env=TREE_ENV,
                         log_path=log_path if name == "tree" else None) as server:
            answers[name] = server.client.complete(prompt, 24, ignore_eos=True)
    log = log_path.read_text(errors="replace")
    off = [line for line in log.splitlines() if "spec tree:" in line]
    assert len(off) == 1 and "spec tree: off: a recurrent or hybrid target" in off[0], off
    assert off[0].rstrip().endswith("; verifying the chain"), off
    assert answers["tree"].tokens == answers["alone"].tokens
    assert answers["tree"].draft_n > 0 and answers["tree"].timings["draft_tree_budget"] == 0
