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

`DFLASH_GGUF_TEST_LLAMA_BIN=<bin dir> pytest tests/test_patches.py` runs the same tests against the
programs of another build; against an unpatched build of the pinned tree all 16 fail (the two of 0006 only on a CPU with AMX).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from dflash_gguf.convert.converter import convert
from tests.fixtures.target_model import convert_target
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

    # taps the target's last layer (HF id 5, GGUF 6 == n_layer): within its depth, so our converter
    # accepts it, but the qwen3 graph records the inputs of layers 1..5 only
    src = shutil.copytree(fixtures / "dflash-b16", work / "last-id")
    edit_config(src, dflash__target_layer_ids=[0, 2, 5])
    out["last-id"] = work / "last-id.gguf"
    convert(src, fixtures / "target-hf", out["last-id"])
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
    from tests.fixtures.trained_gguf import held_out_prompts

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
    steps) the controller parks; every 8, 16, 32, 64 parked steps it drafts one block to score it.
    Unpatched: "auto" is not a number and llama-server exits at argument parsing."""
    from tests.fixtures.trained_gguf import held_out_prompts

    prompts = held_out_prompts()[:3]
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
        assert len(t["draft_full_offered_per_depth"]) == 7  # whole drafted blocks, scored afterwards
        steps += sum(hist)
    assert len(decisions) == steps, "one `spec auto:` line per generation step"
    assert [int(d[1]) for d in decisions[:6]] == [7, 7, 7, 7, 0, 0]  # start-up calibration
    after = decisions[6:]
    parked = [d for d in after if d[2] == "1"]
    assert len(parked) > len(after) / 2, f"parked {len(parked)} of {len(after)} steps"
    probes = [i for i, d in enumerate(after) if d[5] == "probe"]
    assert probes and all(int(after[i][1]) == 0 for i in probes)


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
