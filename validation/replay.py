"""The target alone, evaluating again the very batches a llama-server run evaluated.

A greedy token is the target's own when it is the argmax of the row that produced it. Which row
that is matters on llama.cpp's CPU build: a token's logits depend on how many tokens share its
batch (quantized weights go through repacked or tinyBLAS kernels for wider batches, vec_dot for
one), so a verify batch of width 4 may pick the other side of a near-tie than plain decoding.
`Replay` loads the target in-process, through llama-cpp-python's bindings on the same patched
libllama, with the context llama-server gave it (threads, batch sizes, flash attention, KV types,
repacking: `ServerContext.from_args`; `--exact`'s reference kernels), and evaluates the prompt,
then each step as the server's log recorded it (validation/server_steps.py): the same tokens at
the same positions in batches of the same width, the rejected drafts' cache entries removed after
each step as the server removes them. Row r of a step is then exactly what the target computed for
the token after it, without the drafter; `validation/lossless.py` compares it with what the run
emitted.

Recurrent and hybrid targets (Gated DeltaNet, short conv, Mamba-2) and sliding-window ones follow
the server's memory too: the context keeps as many recurrent-state snapshots per sequence as the
server's (`n_rs_seq`, which llama-server sets to the draft length for DFlash and DSpark), so a
partial rollback is the same `llama_memory_seq_rm`; the prompt goes in the batches the server
split it into; and a step the server rolled back through a checkpoint is rolled back the same way:
the sequence's partial state saved before the step (`llama_state_seq_get_data_ext`,
LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY), loaded after it, the cache dropped from the checkpoint on,
then the server's next step, which verifies the tokens the target took.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from dflash_gguf.runner import bindings as engine
from dflash_gguf.runner.launch import EXACT_ENV, ServerArgs
from .server_steps import Step, tree_memory

TOP = 8  # logits kept per row: the top few, for the report and the noise measurement

# llama-server's own defaults (common/common.h) for what decides the numerics
_N_BATCH, _N_UBATCH = 2048, 512
_DRAFT_N_MAX = 3
AUTO_N_MAX = 16  # what --spec-draft-n-max auto sets llama-server's n_max to (patches 0008, 0016)
# the speculative types for which the server keeps recurrent-state snapshots (need_n_rs_seq)
_SNAPSHOT_SPEC_TYPES = {"draft-mtp", "draft-eagle3", "draft-dflash", "draft-dspark"}
_CACHE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30,
                "iq4_nl": 20}
_FLASH = {"on": 1, "off": 0, "auto": -1, "enabled": 1, "disabled": 0}


def _env_threads() -> int | None:
    """LLAMA_ARG_THREADS, which llama-server takes for -t when the command line has none."""
    value = os.environ.get("LLAMA_ARG_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


@dataclass(frozen=True)
class ServerContext:
    """The llama_context / llama_model settings of a llama-server command line that change numbers."""

    n_ctx: int
    n_seq: int = 1
    threads: int | None = None
    threads_batch: int | None = None
    n_batch: int = _N_BATCH
    n_ubatch: int = _N_UBATCH
    flash_attn: int = -1
    type_k: int = 1
    type_v: int = 1
    repack: bool = True
    swa_full: bool = False
    kv_unified: bool = True
    n_rs_seq: int = 0  # recurrent-state snapshots per sequence (llama.cpp clamps it to 0 for other targets)
    reference_kernels: bool = False  # the server ran with EXACT_ENV (--exact)

    @classmethod
    def from_args(cls, args: Sequence[str], n_ctx: int, reference_kernels: bool = False) -> "ServerContext":
        given = ServerArgs(tuple(str(a) for a in args))

        def number(flags: tuple[str, ...], default):
            value = given.value_of(flags)
            return int(value) if value is not None else default

        flash = (given.value_of(("-fa", "--flash-attn")) or "auto").lower()
        spec_types = set((given.value_of(("--spec-type",)) or "").lower().split(","))
        return cls(
            n_ctx=number(("-c", "--ctx-size"), n_ctx),
            n_seq=number(("-np", "--parallel"), 1),
            threads=number(("-t", "--threads"), _env_threads()),
            threads_batch=number(("-tb", "--threads-batch"), None),
            n_batch=number(("-b", "--batch-size"), _N_BATCH),
            n_ubatch=number(("-ub", "--ubatch-size"), _N_UBATCH),
            flash_attn=_FLASH.get(flash, -1),
            type_k=_CACHE_TYPES.get((given.value_of(("-ctk", "--cache-type-k")) or "f16").lower(), 1),
            type_v=_CACHE_TYPES.get((given.value_of(("-ctv", "--cache-type-v")) or "f16").lower(), 1),
            repack="--no-repack" not in given.passthrough and "-nr" not in given.passthrough,
            swa_full="--swa-full" in given.passthrough,
            kv_unified="-no-kvu" not in given.passthrough and "--no-kv-unified" not in given.passthrough,
            n_rs_seq=_n_rs_seq(given) if spec_types & _SNAPSHOT_SPEC_TYPES else 0,
            reference_kernels=reference_kernels,
        )

    def as_logged(self, log: Path) -> "ServerContext":
        """This context with the sequences and KV layout the server set itself for a draft tree (its log)."""
        tree = tree_memory(log)
        return self if tree is None else dataclasses.replace(self, n_seq=tree[0], kv_unified=tree[1])


def _n_rs_seq(given: ServerArgs) -> int:
    """The server's snapshots per sequence: its --spec-draft-n-max, which `auto` sets to AUTO_N_MAX
    (ggml_patches/0008, common/arg.cpp) before the drafter clamps its own copy to its block."""
    value = given.value_of(("--spec-draft-n-max",))
    if value is None:
        return _DRAFT_N_MAX
    return AUTO_N_MAX if value.strip().lower() == "auto" else int(value)


def _seq_pack(lib):
    """llama_memory_seq_pack (patch 0010: after a tree step the server moves the accepted nodes next to
    the root, so the cache is laid out as a chain's), or None in a build without it."""
    try:
        function = lib.llama_cpp._lib.llama_memory_seq_pack
    except AttributeError:
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32]
    function.restype = ctypes.c_bool
    return function


@dataclass
class Row:
    """What the target computed for one emitted token: its batch, and the logits that decide it."""

    position: int      # of the row's input token (the emitted token goes to position + 1)
    width: int         # rows in that batch (1: plain decoding)
    argmax: int
    top_ids: np.ndarray
    top_logits: np.ndarray
    emitted_logit: float  # the logit of the token the run emitted

    @property
    def margin(self) -> float:
        """logit(argmax) - logit(emitted): 0 when the emitted token is the target's choice."""
        return float(self.top_logits[0]) - self.emitted_logit


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    """`values` set in this process's environment for the duration, then restored."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class Replay(engine.HeldModel):
    """One target loaded in-process with a server's context; use as a context manager."""

    def __init__(self, model: str | Path, context: ServerContext, *, bin_dir: Path | None = None):
        self.model_path = Path(model)
        self.context = context
        self.bin_dir = bin_dir
        self._n_vocab = 0
        self._pack = None

    def __enter__(self) -> "Replay":
        engine.use_patched_library(bin_dir=self.bin_dir)
        lib = self._lib = engine.bindings()
        engine.quiet_logs(lib)
        lib.llama_backend_init()
        mparams = lib.llama_model_default_params()
        mparams.use_extra_bufts = self.context.repack
        self._model = lib.llama_model_load_from_file(str(self.model_path).encode(), mparams)
        if not self._model:
            raise RuntimeError(f"{self.model_path}: llama.cpp could not load it for the replay")
        c = self.context
        cparams = lib.llama_context_default_params()
        cparams.n_ctx, cparams.n_seq_max = c.n_ctx, c.n_seq
        cparams.n_batch, cparams.n_ubatch = c.n_batch, c.n_ubatch
        if c.threads:
            cparams.n_threads = c.threads
            cparams.n_threads_batch = c.threads_batch or c.threads
        cparams.flash_attn_type = c.flash_attn
        cparams.type_k, cparams.type_v = c.type_k, c.type_v
        cparams.swa_full, cparams.kv_unified = c.swa_full, c.kv_unified
        cparams.n_rs_seq = c.n_rs_seq
        with _environment(EXACT_ENV if c.reference_kernels else {}):  # read when the CPU backend starts
            self._ctx = lib.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise RuntimeError(f"{self.model_path}: no llama.cpp context for the replay")
        self._n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self._model))
        self._pack = _seq_pack(lib)
        return self

    # -----------------------------------------------------------------------------------------

    def _decode(self, tokens: Sequence[int], position: int, outputs: Sequence[int],
                positions: Sequence[int] | None = None, seqs: Sequence[Sequence[int]] | None = None) -> list[np.ndarray]:
        """One llama_decode call, as the server makes it; the logits of the rows in `outputs`. Token i
        goes to `position + i` in sequence 0, unless `positions` and `seqs` say otherwise (a tree)."""
        lib = self._lib
        batch = lib.llama_batch_init(len(tokens), 0, max((len(s) for s in seqs), default=1) if seqs else 1)
        try:
            wanted = set(outputs)
            for i, token in enumerate(tokens):
                batch.token[i] = int(token)
                batch.pos[i] = positions[i] if positions is not None else position + i
                ids = seqs[i] if seqs is not None else (0,)
                batch.n_seq_id[i] = len(ids)
                for k, seq in enumerate(ids):
                    batch.seq_id[i][k] = seq
                batch.logits[i] = 1 if i in wanted else 0
            batch.n_tokens = len(tokens)
            status = lib.llama_decode(self._ctx, batch)
            if status != 0:
                raise RuntimeError(f"llama_decode returned {status} in the replay at position {position}")
            rows = []
            for i in outputs:
                pointer = lib.llama_get_logits_ith(self._ctx, i)
                rows.append(np.ctypeslib.as_array(pointer, shape=(self._n_vocab,)).copy())
            return rows
        finally:
            lib.llama_batch_free(batch)

    @staticmethod
    def _sequences(step: Step) -> dict[int, list[int]]:
        """Per node of a tree step (0: the root), the sequences of the leaves under it, the leaves
        numbered 1, 2, ... in node order."""
        has_child = set(step.parents)
        under: dict[int, list[int]] = {j: [] for j in range(len(step.parents) + 1)}
        leaves = [j for j in range(1, len(step.parents) + 1) if j not in has_child]
        for seq, node in enumerate(leaves, start=1):
            while True:
                under[node].append(seq)
                if node == 0:
                    break
                node = step.parents[node - 1]
        return under

    def _decode_tree(self, step: Step) -> list[np.ndarray]:
        """A tree step's batch as the server makes it (patch 0009): the root (`last`, in sequence 0 and
        every leaf's) and the nodes at `position + depth`, each in the sequences of the leaves under
        it, every leaf seeing sequence 0's cache through a copy; every row's logits."""
        lib, memory = self._lib, self._lib.llama_get_memory(self._ctx)
        under = self._sequences(step)
        for seq in under[0]:
            lib.llama_memory_seq_cp(memory, 0, seq, -1, -1)
        seqs = [[0, *under[0]]] + [under[j] for j in range(1, len(step.parents) + 1)]
        positions = [step.position + step.depth(j) for j in range(len(step.parents) + 1)]
        return self._decode([step.last, *step.drafts], step.position, list(range(len(seqs))), positions, seqs)

    def _keep_path(self, step: Step, path: Sequence[int]) -> None:
        """After a tree step, the server's seq_cp / seq_rm: the accepted nodes join sequence 0, the
        leaves' sequences go."""
        lib, memory = self._lib, self._lib.llama_get_memory(self._ctx)
        under = self._sequences(step)
        if path:
            lib.llama_memory_seq_cp(memory, under[path[-1]][0], 0, step.position + 1, step.position + 1 + len(path))
        for seq in under[0]:
            lib.llama_memory_seq_rm(memory, seq, -1, -1)
        if path and self._pack is not None:
            self._pack(memory, 0, step.position + 1, step.position + 1 + len(path))

    def _forget_after(self, position: int) -> None:
        lib = self._lib
        if not lib.llama_memory_seq_rm(lib.llama_get_memory(self._ctx), 0, position, -1):
            raise RuntimeError(f"the replay cannot drop the cache from position {position} on, as the server did "
                               f"(n_rs_seq = {self.context.n_rs_seq})")

    def _checkpoint(self) -> bytes:
        """The sequence's partial state (what cannot be rolled back), as the server saves it."""
        lib, flags = self._lib, self._lib.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = lib.llama_state_seq_get_size_ext(self._ctx, 0, flags)
        buffer = (ctypes.c_uint8 * size)()
        if lib.llama_state_seq_get_data_ext(self._ctx, buffer, size, 0, flags) != size:
            raise RuntimeError("the replay could not save the checkpoint")
        return bytes(buffer)

    def _restore(self, checkpoint: bytes, position: int) -> None:
        """The server's restore: the saved partial state back, the cache from `position` on dropped."""
        lib = self._lib
        buffer = (ctypes.c_uint8 * len(checkpoint)).from_buffer_copy(checkpoint)
        flags = lib.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        if lib.llama_state_seq_set_data_ext(self._ctx, buffer, len(checkpoint), 0, flags) != len(checkpoint):
            raise RuntimeError("the replay could not restore the checkpoint")
        self._forget_after(position)

    @staticmethod
    def _row(logits: np.ndarray, position: int, width: int, emitted: int) -> Row:
        top = np.argpartition(logits, -TOP)[-TOP:]
        top = top[np.argsort(-logits[top], kind="stable")]
        best = int(np.argmax(logits))  # the first maximum, as the greedy sampler takes it
        if best != int(top[0]):
            top = np.concatenate([[best], top[top != best]])[:TOP]
        return Row(position, width, best, top.astype(np.int64), logits[top].astype(np.float32),
                   float(logits[int(emitted)]))

    def _prompt_batches(self, n_prompt: int, starts: Sequence[int]) -> list[int]:
        """Where each of the prompt's batches begins: the server's, when its log said, else every
        n_batch tokens as it queues a prompt without checkpoints."""
        starts = sorted({0, *(s for s in starts if 0 < s < n_prompt)})
        if len(starts) == 1:
            starts = list(range(0, n_prompt, self.context.n_batch))
        return starts

    def run(self, prompt: Sequence[int], emitted: Sequence[int], steps: Sequence[Step],
            prompt_batches: Sequence[int] = (), logged: Sequence[int] = ()) -> list[Row]:
        """The row that produced each emitted token (the first: the prompt's last row; then each
        step's), evaluated in the server's batches, its rollbacks and restores followed. Fewer
        rows than tokens when the steps stop short (a log that does not cover the run); the
        caller counts what was checked. A batch's drafts that the log does not give (a step that
        verifies again what a restore took back) are the tokens the server `logged` as emitted,
        where it logged them all, else the `emitted` ones."""
        prompt, emitted = [int(t) for t in prompt], [int(t) for t in emitted]
        source = [int(t) for t in logged] if len(logged) == len(emitted) else emitted
        lib = self._lib
        lib.llama_memory_clear(lib.llama_get_memory(self._ctx), True)
        if not emitted:
            return []
        rows: list[Row] = []
        starts = self._prompt_batches(len(prompt), prompt_batches)
        for start, end in zip(starts, starts[1:] + [len(prompt)]):
            # llama_decode splits each batch into ubatches as the server's call does
            out = self._decode(prompt[start:end], start, [end - start - 1] if end == len(prompt) else [])
        rows.append(self._row(out[0], len(prompt) - 1, len(prompt) - starts[-1], emitted[0]))
        done = 1
        checkpoint = b""
        for step in steps:
            remaining = len(emitted) - done
            if remaining <= 0:
                break
            if step.position != len(prompt) + done - 1:
                break  # the log does not describe this run from here on
            n_emit = step.emitted(remaining)
            drafts = list(step.drafts) if len(step.drafts) == step.width - 1 else []
            if not drafts:  # not logged: the emitted tokens stand in (rejected rows come after every checked row)
                drafts = (source[done:done + step.width - 1] + [source[done + n_emit - 1]] * step.width)[:step.width - 1]
            if step.is_tree:
                path = self._tree_path(step, emitted[done:done + n_emit - 1])
                logits = self._decode_tree(step)
                self._keep_path(step, path or [])
                if path is None:
                    break  # the emitted tokens are not a path of the logged tree: not this run's batch
                for r, node in enumerate([0, *path]):
                    rows.append(self._row(logits[node], step.position + r, step.width, emitted[done + r]))
                done += n_emit
                self._forget_after(step.position + n_emit)
                continue
            tokens = [step.last] + drafts  # the server's batch, even where a response says otherwise
            if step.restored_from is not None and not step.replay:
                checkpoint = self._checkpoint()  # saved before the verify batch; a replay step reuses it
            logits = self._decode(tokens, step.position, list(range(step.width)))
            if step.restored_from is not None:
                self._restore(checkpoint, step.restored_from)
                continue
            for r in range(n_emit):
                rows.append(self._row(logits[r], step.position + r, step.width, emitted[done + r]))
            done += n_emit
            self._forget_after(step.position + n_emit)
        return rows

    @staticmethod
    def _tree_path(step: Step, accepted: Sequence[int]) -> list[int] | None:
        """The nodes that emitted `accepted` (the tree's drafts the run emitted): the server's logged
        path where it carries those tokens, else the walk down the tree by them."""
        if step.path is not None and [step.drafts[j - 1] for j in step.path[:len(accepted)]] == list(accepted):
            return step.path[:len(accepted)]
        return step.walk(accepted)

    def plain(self, prompt: Sequence[int], emitted: Sequence[int], prompt_batches: Sequence[int] = ()) -> list[Row]:
        """The rows of plain decoding: one token per batch."""
        steps = [Step(len(prompt) + i - 1, 1, int(t)) for i, t in enumerate(emitted[:-1], start=1)]
        return self.run(prompt, emitted, steps, prompt_batches)
