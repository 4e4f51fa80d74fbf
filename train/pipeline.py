"""`dflash-gguf train`: a drafter for the GGUF you run, with the llama.cpp build that will serve it as
the teacher.

    prompts ─► llama-server renders them (chat template) ─► Teacher (in-process libllama): greedy
    answers, tapped layer inputs, top-k ─► shards on disk ─► memory-mapped store ─► recipe.train_drafter
    (torch, the target's embedding and head frozen from the GGUF; checkpointed, resumable) ─► z-lab
    checkpoint in -o (built beside it, renamed into place) ─► convert + validate on held-out prompts
    (llama.cpp's own tau, and lossless) ─► the card.

The teacher's store is cached under a key of what it depends on (target file, prompts, taps, answer
length), so a rerun after a kill, or another drafter for the same target and prompts, reuses it;
the training checkpoint is keyed by the run's settings and its output, so a rerun of the same
command continues where the last one stopped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import resource
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from dflash_gguf.convert.converter import convert
from dflash_gguf.errors import CheckpointError, InputError
from dflash_gguf.gguf.checkpoint import DrafterCheckpoint
from dflash_gguf.gguf.drafter_fit import DrafterFacts, check_dflash2_shapes
from dflash_gguf.gguf.keys import Tokenizer
from dflash_gguf.owned_folder import built_beside, check_destination
from dflash_gguf.paths import cache_dir
from dflash_gguf.progress import Progress, working
from dflash_gguf.runner.build import find_bin_dir
from dflash_gguf.runner.launch import launch_recipe
from dflash_gguf.runner.prompts import Prompt, read_prompts, tokenize_prompts
from dflash_gguf.validation.validate import ValidationSettings
from dflash_gguf.variants import VARIANTS, Variant
from . import recipe, store
from . import settings as st
from .frozen import COPYABLE, FrozenTarget, GGUFWeights
from .heldout import measure_apart
from .recipe import DrafterShape, drafter_config_dict
from .teacher import Teacher

log = logging.getLogger(__name__)

CARD_MARK = "<!-- written by dflash-gguf train -->"
SEED = 20261202


@dataclass
class TrainOptions:
    variant: str = Variant.DFLASH.value
    layers: int | None = None
    block_size: int | None = None
    target_layer_ids: tuple[int, ...] | None = None
    init: Path | None = None
    minutes: float | None = None
    steps: int | None = None
    answer_tokens: int = 128
    holdout: float = 0.1
    eval_prompts: Path | None = None
    eval_tokens: int = 64
    parallel: int = 16                # conversations the teacher answers at once (one llama_decode)
    threads: int | None = None        # llama.cpp and torch threads
    lr: float | None = None           # peak learning rate; None: the variant's (train/settings.py)
    checkpoint_minutes: float = 3.0
    seed: int = SEED
    validate: bool = True
    llama_bin: Path | None = None
    backend: str | None = None
    device: str = "auto"              # where torch trains: auto, cpu, cuda, mps


@dataclass
class Summary:
    """What the run did, for the card, the printout and --json."""

    target: str
    variant: str
    layers: int
    block_size: int
    target_layer_ids: list[int]
    mask_token_id: int
    initialised_from: str
    prompts_trained: int
    prompts_held_out: int
    answer_tokens: int
    teacher_seconds: float  # what making the answers took (recorded in the store when reused; 0 if unknown)
    teacher_store_bytes: int
    steps: int
    lr: float
    train_seconds: float
    device: str = "cpu"
    minutes: float | None = None  # the --minutes budget; None with --steps
    step_rates: list[float] | None = None  # slowest and fastest steps/s over 25-step windows
    peak_rss_bytes: int = 0
    held_out: dict = field(default_factory=dict)
    teacher_reused: bool = False


def _sha(*parts: object) -> str:
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:16]


def _file_key(path: Path) -> tuple:
    st_ = path.stat()
    return (str(path.resolve()), st_.st_size, st_.st_mtime_ns)


# --- the output folder ------------------------------------------------------------------------

def check_output(out: Path, force: bool) -> None:
    """Refuse an -o the drafter folder may not be put at: one holding anything but an earlier `train`
    output's own files, as its manifest records them (owned_folder.py), or such an output without --force."""
    check_destination(out, force, "train")


# --- prompts ----------------------------------------------------------------------------------

def split_prompts(prompts: list[Prompt], options: TrainOptions, source: Path) -> tuple[list[Prompt], list[Prompt]]:
    """(training, held out): --eval-prompts, else a seeded share of the file (at least one)."""
    if options.eval_prompts is not None:
        held = read_prompts(options.eval_prompts)
        names = {str(p) for p in held}
        return [p for p in prompts if str(p) not in names], held
    if not options.validate:
        return prompts, []
    if len(prompts) < 2:
        raise InputError(f"{source}: {len(prompts)} prompt; training holds a share out to measure tau, so give at "
                         "least 2, or --eval-prompts FILE")
    order = list(range(len(prompts)))
    random.Random(options.seed).shuffle(order)
    n_held = max(1, round(len(prompts) * options.holdout))
    held = set(order[:n_held])
    return [p for i, p in enumerate(prompts) if i not in held], [prompts[i] for i in sorted(held)]


def render(target: Path, prompts: Sequence[Prompt], options: TrainOptions) -> list[list[int]]:
    """The token ids llama-server evaluates for each prompt (its chat template, its tokenizer)."""

    launch = launch_recipe(target, None, server_args=["-c", "512", *(["-t", str(options.threads)]
                                                                      if options.threads else [])])
    with launch.server(bin_dir=_bin_dir(options)) as server:
        return tokenize_prompts(server.client, prompts)


def _bin_dir(options: TrainOptions) -> Path:

    return find_bin_dir(options.backend, options.llama_bin)


# --- teacher ----------------------------------------------------------------------------------

def teacher_store(target: Path, prompt_ids: list[list[int]], plan: st.DrafterPlan, options: TrainOptions,
                  progress: Progress) -> tuple[Path, float, bool]:
    """The store of the teacher's answers (made, or found made), the seconds making it took, and
    whether an earlier run made it."""

    key = _sha("teacher-v3", _file_key(target), prompt_ids, plan.llama_taps, options.answer_tokens, st.TEACHER_TOP_K)
    folder = cache_dir() / "train" / key
    made_before = store.info(folder)
    if made_before is not None:
        progress(f"teacher: using the answers already made in {folder}")
        return folder, made_before.get("seconds", 0.0), True
    folder.mkdir(parents=True, exist_ok=True)
    groups = [list(range(i, min(i + options.parallel, len(prompt_ids))))
              for i in range(0, len(prompt_ids), options.parallel)]
    started, made = time.time(), 0
    n_ctx = max(map(len, prompt_ids)) + options.answer_tokens + 1
    with working(progress, "teacher"), \
            Teacher(target, plan.llama_taps, n_ctx=n_ctx, n_seq=options.parallel, top_k=st.TEACHER_TOP_K,
                    threads=options.threads, bin_dir=_bin_dir(options)) as teacher:
        if teacher.recurrent:
            progress("teacher: one conversation at a time (the target has recurrent state, and the pinned "
                     "llama.cpp's batched steps of several such sequences are unreliable)")
        for index, rows in enumerate(groups):
            if store.shard_path(folder, index).is_file():
                continue
            answers = teacher.answer([prompt_ids[r] for r in rows], options.answer_tokens)
            store.write_shard(folder, index, answers)
            made += sum(len(a.ids) - a.prompt_len for a in answers)
            elapsed = time.time() - started
            left = elapsed / made * options.answer_tokens * sum(len(g) for g in groups[index + 1:]) if made else 0
            progress(f"teacher: {rows[-1] + 1}/{len(prompt_ids)} prompts answered, {made / elapsed:.0f} answer "
                     f"tokens/s, ETA {_clock(left)}")
        if teacher.answered_alone:
            progress(f"teacher: {teacher.answered_alone} conversations answered again alone (llama.cpp gave "
                     "non-finite logits to them in a batched step)")
    seconds = time.time() - started
    info = store.merge(folder, len(groups), seconds)
    progress(f"teacher: {info['rows']} answers, {info['bytes'] / 2**20:.0f} MiB on disk in {folder} "
             f"({seconds:.0f} s)")
    return folder, seconds, False


def _pace(summary: Summary) -> str:
    """What the training time was measured against: the --minutes budget, and the step rate's range
    (the load of a shared machine moves it; a timed run re-sizes its steps to it)."""
    parts = [f"budget {summary.minutes:g} min"] if summary.minutes is not None else []
    if summary.step_rates:
        low, high = summary.step_rates
        parts.append(f"{low:.2f}-{high:.2f} steps/s over 25-step windows")
    return f" ({'; '.join(parts)})" if parts else ""


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


# --- the drafter ------------------------------------------------------------------------------

def plan_drafter(weights: GGUFWeights, options: TrainOptions) -> tuple[st.DrafterPlan, dict | None]:
    """The drafter's shape: from --init's config, or the defaults for this target and the options."""
    shape = weights.shape
    if options.init is not None:
        return _plan_from_init(weights, options)
    layers = options.layers or st.default_layers(shape)
    taps = tuple(options.target_layer_ids or st.default_taps(shape, layers))
    if max(taps) >= shape.n_layer or min(taps) < 0:
        raise InputError(f"--target-layers {','.join(map(str, taps))}: the target has layers 0..{shape.n_layer - 1}")
    tokens = weights.field(Tokenizer.TOKENS) or []
    types = weights.field(Tokenizer.TOKEN_TYPE) or [1] * len(tokens)
    special = {weights.field(k) for k in (Tokenizer.BOS_ID, Tokenizer.EOS_ID, Tokenizer.EOT_ID, Tokenizer.PAD_ID,
                                          Tokenizer.UNK_ID)}
    mask = st.mask_token(tokens, types, special, weights.field(Tokenizer.CHAT_TEMPLATE))
    if mask is None:
        raise InputError(f"{weights.path}: its vocabulary has no unused or spare control token to pad the drafter's "
                         "blocks with; start from a drafter that names one (--init)")
    block = options.block_size or st.VARIANTS[options.variant]["block_size"]
    return st.DrafterPlan(options.variant, layers, block, taps, mask), None


def check_llama_loads(plan: st.DrafterPlan, weights: GGUFWeights, init: Path | None = None) -> None:
    """The shapes llama.cpp's loader refuses (the converter's own check), before the teacher runs: a
    drafter convert would refuse is never trained for half an hour first."""
    spec = plan.spec()
    if init is not None:  # a drafter --init names keeps its own DFlash 2 shapes, not the recipe's
        ckpt = DrafterCheckpoint(init)
        spec = {**spec, "conv_group_size": ckpt.conv[1] if ckpt.conv else None,
                "selector_top_k": ckpt.selector[1] if ckpt.selector else None}
    facts = DrafterFacts(source=f"--variant {plan.variant} on {weights.path}", hidden=weights.shape.n_embd,
                         vocab=None, target_layer_ids=plan.target_layer_ids, mask_token_id=plan.mask_token_id,
                         conv_group_size=spec.get("conv_group_size"), selector_top_k=spec.get("selector_top_k"))
    try:
        check_dflash2_shapes(facts)
    except CheckpointError as err:
        raise InputError(f"{err}; train --variant dflash on this target") from None


def _plan_from_init(weights: GGUFWeights, options: TrainOptions) -> tuple[st.DrafterPlan, dict]:
    """The plan of the drafter --init names (the converter's typed reader), checked against the target."""

    ckpt = DrafterCheckpoint(options.init)
    where, shape = f"--init {options.init}", weights.shape
    variant = st.ARCHITECTURES.get(ckpt.architecture)
    if variant is None:
        raise CheckpointError(f"{where}: a {ckpt.architecture}; train continues "
                              f"{' or '.join(st.ARCHITECTURES)} drafters")
    if ckpt.hidden_size != shape.n_embd:
        raise CheckpointError(f"{where}: config.json hidden_size is {ckpt.hidden_size}, the target's width is "
                              f"{shape.n_embd}; give a drafter made for this target's family")
    if ckpt.vocab_size != shape.n_vocab:
        raise CheckpointError(f"{where}: config.json vocab_size is {ckpt.vocab_size}, the target's vocabulary has "
                              f"{shape.n_vocab} tokens; give a drafter made for this target's family")
    taps = tuple(ckpt.target_layer_ids)
    if max(taps) >= shape.n_layer:
        raise CheckpointError(f"{where}: target_layer_ids {list(taps)} reach past the target's {shape.n_layer} layers")
    if ckpt.mask_token_id is None:
        raise CheckpointError(f"{where}: config.json names no mask_token_id; add the one it was trained with")
    plan = st.DrafterPlan(variant, ckpt.n_layers, ckpt.block_size, taps, ckpt.mask_token_id)
    return plan, ckpt.config


def drafter_config(plan: st.DrafterPlan, shape, init_config: dict | None) -> dict:

    if init_config is not None:
        return init_config
    return drafter_config_dict(plan.spec(), DrafterShape(
        hidden=shape.n_embd, n_head=shape.n_head, n_head_kv=shape.n_head_kv, head_dim=shape.head_dim,
        ffn=shape.n_ff, vocab=shape.n_vocab, rope_theta=shape.rope_theta, rms_eps=shape.rms_eps,
        max_positions=shape.n_ctx_train, num_target_layers=shape.n_layer, target_layer_ids=plan.target_layer_ids,
        mask_token_id=plan.mask_token_id, eos_token_id=shape.eos_token_id))


def _copy_sources(plan: st.DrafterPlan, shape) -> range:
    """The target layers a new drafter starts as (recipe.init_from_target), when they exist."""
    first = plan.target_layer_ids[-1] + 1
    if shape.arch in COPYABLE and first + plan.layers <= shape.n_layer:
        return range(first, first + plan.layers)
    return range(0)


def torch_device(name: str) -> torch.device:
    """--torch-device as torch names it; one asked for that this torch cannot reach is refused."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--torch-device cuda: this torch ({torch.__version__}) sees no CUDA GPU; install a CUDA "
                         "build of torch (pytorch.org/get-started) or pass --torch-device cpu")
    if name == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"--torch-device mps: this torch ({torch.__version__}) sees no Apple GPU (Metal); pass "
                         "--torch-device cpu")
    return torch.device(name)


def bf16_on(device: torch.device) -> bool:
    """Whether the recipe's bf16 autocast pays on `device`: a GPU with bf16 units, or a CPU that computes
    bf16 natively (bf16_pays). MPS trains in float32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and bf16_pays()


def bf16_pays() -> bool:
    """Whether the CPU computes bf16 natively (AVX-512 BF16, AMX), where the recipe's bf16 autocast is
    the fast path. Without it bf16 is emulated: on this project's AVX2 machine a 1600x256x768 linear,
    forward and backward, took 1.50 s under bf16 autocast against 0.10 s in float32 (one thread)."""

    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


# --- card -------------------------------------------------------------------------------------

def card(summary: Summary, target: Path) -> str:
    held = summary.held_out
    tau = (f"**{held['tau']:.3f}** tokens per target step on {held['prompts']} held-out prompts "
           f"({held['n_predict']} new tokens each, greedy, llama.cpp {held['llama']}; lossless: "
           f"{'yes' if held['lossless'] else 'no'})") if held else "not measured (--no-validate)"
    variant = VARIANTS[summary.variant].title
    teacher = f"{summary.teacher_seconds:.0f} s" if summary.teacher_seconds else "time not recorded"
    if summary.teacher_reused:
        teacher += ", answers made by an earlier run and reused"
    return f"""---
tags:
- dflash
- speculative-decoding
- gguf
- llama.cpp
---
{CARD_MARK}

# {variant} drafter for {target.name}

A {summary.layers}-layer {variant} drafter (block {summary.block_size}) for `{target.name}`, trained by
`dflash-gguf train` with that GGUF as the teacher: the target's greedy answers to {summary.prompts_trained}
prompts (at most {summary.answer_tokens} tokens each) and its layer inputs at layers
{summary.target_layer_ids} (llama.cpp layers {[i + 1 for i in summary.target_layer_ids]}), computed by
llama.cpp itself; the target's embedding and output head, frozen, read from the same file.

| | |
|---|---|
| started from | {summary.initialised_from} |
| steps | {summary.steps} (peak learning rate {summary.lr:g}) |
| teacher | {teacher} ({summary.teacher_store_bytes / 2**20:.0f} MiB of states on disk) |
| training | {summary.train_seconds:.0f} s on {summary.device}{_pace(summary)} |
| mask token | {summary.mask_token_id} |
| held-out tau | {tau} |

Convert it with `dflash-gguf convert DIR --target {target.name}`; it borrows the target's embeddings
and head at run time, so it serves that target only.
"""


# --- the run ----------------------------------------------------------------------------------

def train(target: Path, prompts_file: Path, out: Path, options: TrainOptions, *, force: bool = False,
          progress: Progress | None = None, step_progress=None) -> Summary:
    """Train, write the drafter folder to `out` whole, measure it; see the module's docstring."""

    progress = progress or log.info
    check_output(out, force)
    prompts = read_prompts(prompts_file)
    training, held_out = split_prompts(prompts, options, prompts_file)
    if not training:
        raise InputError(f"{prompts_file}: no prompt is left to train on once the held-out ones are set aside")
    weights = GGUFWeights(target)
    device = torch_device(options.device)
    plan, init_config = plan_drafter(weights, options)
    check_llama_loads(plan, weights, options.init)
    with Teacher(target, plan.llama_taps, n_ctx=64, n_seq=1, top_k=st.TEACHER_TOP_K, threads=options.threads,
                 bin_dir=_bin_dir(options)):
        pass  # refuses a target whose graph does not record the layer inputs the drafter reads
    if options.threads:
        torch.set_num_threads(options.threads)

    progress(f"rendering {len(training)} training prompts with the target's chat template")
    prompt_ids = render(target, training, options)
    room = weights.shape.n_ctx_train - options.answer_tokens
    usable = [ids for ids in prompt_ids if 1 < len(ids) <= room]
    if not usable:
        raise InputError(f"{prompts_file}: no prompt fits the target's context of {weights.shape.n_ctx_train} "
                         f"tokens with {options.answer_tokens} answer tokens")
    folder, teacher_seconds, teacher_reused = teacher_store(target, usable, plan, options, progress)
    data = store.distill_set(folder, plan.mask_token_id)

    copy = _copy_sources(plan, weights.shape) if init_config is None else range(0)
    bf16 = bf16_on(device)
    frozen = FrozenTarget(weights, copy, dtype=torch.bfloat16 if bf16 else torch.float32)
    config = drafter_config(plan, weights.shape, init_config)
    if init_config is not None:
        drafter = recipe.load_drafter(options.init).float()
        drafter.requires_grad_(True)
        started_from = f"`--init {options.init.name}`"
    else:
        drafter = recipe.new_drafter(config, options.seed)
        if copy:
            recipe.init_from_target(drafter, frozen, data.feats[:64, :64])
            started_from = f"copies of target layers {copy.start}-{copy.stop - 1} (scratch otherwise)"
        else:
            started_from = "scratch (random initialisation)"
    frozen, drafter = frozen.to(device), drafter.to(device)
    spec = {**plan.spec(), **({"lr": options.lr} if options.lr else {})}
    run_key = _sha(out.resolve(), asdict(plan), options.steps, options.minutes, options.seed, options.init, spec["lr"])
    checkpoint = folder / f"ckpt-{run_key}.pt"
    run = recipe.TrainingRun(name=plan.variant, seed=options.seed + 1, steps=options.steps,
                             budget_seconds=options.minutes * 60 if options.steps is None else None,
                             checkpoint=checkpoint, checkpoint_seconds=options.checkpoint_minutes * 60, bf16=bf16)
    with working(progress, "train"):
        drafter = recipe.train_drafter(drafter, frozen, data, spec, run, progress=step_progress)
    train_seconds = drafter.trained_seconds

    summary = Summary(target=str(target), variant=plan.variant, layers=plan.layers, block_size=plan.block_size,
                      target_layer_ids=list(plan.target_layer_ids), mask_token_id=plan.mask_token_id,
                      initialised_from=started_from, prompts_trained=len(usable), prompts_held_out=len(held_out),
                      answer_tokens=options.answer_tokens, teacher_seconds=round(teacher_seconds, 1),
                      teacher_reused=teacher_reused,
                      teacher_store_bytes=store.info(folder)["bytes"], steps=drafter.trained_steps, lr=spec["lr"],
                      train_seconds=round(train_seconds, 1), device=str(device),
                      minutes=options.minutes if options.steps is None else None,
                      step_rates=[round(r, 3) for r in drafter.step_rates] if drafter.step_rates else None)
    with built_beside(out, force=force, command="train") as tmp:
        recipe.save_drafter(drafter, tmp, config)
        if held_out and options.validate:
            summary.held_out = measure(target, tmp, held_out, options, progress)
        summary.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        (tmp / "README.md").write_text(card(summary, target), encoding="utf-8")
    checkpoint.unlink(missing_ok=True)
    return summary


def measure(target: Path, drafter_dir: Path, prompts: list[Prompt], options: TrainOptions,
            progress: Progress) -> dict:
    """llama.cpp's own tau on the held-out prompts: the drafter converted against the target, then a
    greedy `validate` pass (every emitted token checked against the target's choice), in a process
    of its own (train/heldout.py)."""

    with tempfile.TemporaryDirectory(prefix="dflash-train-") as work:
        gguf = Path(work) / "drafter.gguf"
        progress("converting the drafter to GGUF for the held-out measurement")
        convert(drafter_dir, target, gguf)
        # tau is what the held-out measurement is for; speed rounds would only lengthen it
        settings = ValidationSettings(n_predict=options.eval_tokens, threads=options.threads,
                                      backend=options.backend, llama_bin=options.llama_bin, rounds=0)
        return measure_apart(target, gguf, prompts, settings)
