"""llama.cpp as the teacher: the target's greedy answers, its layer inputs at the drafter's taps and
its most likely next tokens, computed in-process by the patched libllama that will serve the drafter.

The target runs through llama-cpp-python's bindings (runner/bindings.py). The pinned tree's layer-input
API (`llama_set_embeddings_layer_inp` / `llama_get_embeddings_layer_inp`, src/llama-ext.h) is not
bound there, so this module binds it with ctypes on the same library. Several conversations are
answered at once (one sequence each, one token per sequence per `llama_decode`), and every decode
hands back, for each of its tokens, the input of each tapped layer: what the drafter reads at
serving time, computed by the same kernels, quantization included.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from dflash_gguf.errors import TargetError
from dflash_gguf.runner import bindings as engine


@dataclass
class Answer:
    """One conversation as the teacher saw it."""

    ids: list[int]             # prompt + greedy answer
    prompt_len: int
    taps: np.ndarray           # [len(ids) - 1, n_taps * n_embd] float16: the tapped layer inputs of every fed token
    top_ids: np.ndarray        # [len(ids) - 1, k] int32: the target's k most likely next tokens (answer positions)
    top_logp: np.ndarray       # [len(ids) - 1, k] float16: their log-probabilities over the whole vocabulary


# llama-ext.h declares them in C++ (no extern "C"): Itanium-mangled names (GCC, Clang: Linux, macOS)
_SYMBOLS = {
    "set": ("_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
            [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_bool], None),
    "has": ("_Z30llama_has_embeddings_layer_inpP13llama_contextj", [ctypes.c_void_p, ctypes.c_uint32], ctypes.c_bool),
    "get": ("_Z30llama_get_embeddings_layer_inpP13llama_contextj", [ctypes.c_void_p, ctypes.c_uint32],
            ctypes.POINTER(ctypes.c_float)),
}


def _bind(lib) -> dict:
    """The layer-input functions of src/llama-ext.h, on the library the bindings loaded."""
    so, functions = lib.llama_cpp._lib, {}
    for key, (symbol, argtypes, restype) in _SYMBOLS.items():
        try:
            function = so[symbol]
        except AttributeError:
            raise TargetError(f"{so._name}: this libllama has no {symbol}; it is not the pinned llama.cpp "
                              "(`dflash-gguf llama build` makes it)") from None
        function.argtypes, function.restype = argtypes, restype
        functions[key] = function
    return functions


class Teacher(engine.HeldModel):
    """The target loaded once for answering conversations; use as a context manager.

    `taps` are llama.cpp layer ids (the input of layer L: a checkpoint's target_layer_id + 1)."""

    def __init__(self, target: Path, taps: Sequence[int], *, n_ctx: int, n_seq: int, top_k: int,
                 threads: int | None = None, bin_dir: Path | None = None):
        self.target, self.taps, self.top_k = Path(target), list(taps), top_k
        self.n_ctx, self.n_seq, self.threads, self.bin_dir = n_ctx, n_seq, threads, bin_dir
        self.answered_alone = 0  # conversations answered again alone after non-finite logits in a batch

    def __enter__(self) -> "Teacher":
        engine.use_patched_library(bin_dir=self.bin_dir)
        lib = self._lib = engine.bindings()
        self._layer_inp = _bind(lib)
        engine.quiet_logs(lib)
        lib.llama_backend_init()
        self._model = lib.llama_model_load_from_file(str(self.target).encode(), lib.llama_model_default_params())
        if not self._model:
            raise TargetError(f"{self.target}: llama.cpp could not load it as a model")
        self.n_embd = lib.llama_model_n_embd(self._model)
        self.n_layer = lib.llama_model_n_layer(self._model)
        vocab = lib.llama_model_get_vocab(self._model)
        self.n_vocab = lib.llama_vocab_n_tokens(vocab)
        self._is_eog = lambda token: bool(lib.llama_vocab_is_eog(vocab, token))
        # Batched steps of several sequences with recurrent state go wrong in the pinned llama.cpp (the
        # LFM2 and Qwen3.5 toys: NaN logits, layer inputs past float16, a crash in llama_decode), while
        # one sequence alone is right: such targets are answered one conversation at a time.
        self.recurrent = bool(lib.llama_model_is_recurrent(self._model) or lib.llama_model_is_hybrid(self._model))
        if self.recurrent:
            self.n_seq = 1
        cparams = lib.llama_context_default_params()
        cparams.n_ctx, cparams.n_seq_max = self.n_ctx * self.n_seq, self.n_seq
        cparams.n_batch = cparams.n_ubatch = max(self.n_ctx, self.n_seq)
        cparams.kv_unified = True
        if self.threads:
            cparams.n_threads = cparams.n_threads_batch = self.threads
        self._ctx = lib.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise TargetError(f"{self.target}: llama.cpp could not make a context of "
                              f"{self.n_ctx} x {self.n_seq} tokens")
        for lid in self.taps:
            if lid > self.n_layer or not self._layer_inp["has"](self._ctx, lid):
                raise TargetError(f"{self.target}: the graph of its architecture in this llama.cpp build does not "
                                  f"record the input of layer {lid} (of {self.n_layer}), which a DFlash drafter "
                                  "reads; only targets whose graph records layer inputs can have one "
                                  "(`dflash-gguf doctor` lists them)")
            self._layer_inp["set"](self._ctx, lid, True)
        return self

    # -----------------------------------------------------------------------------------------

    def _decode(self, tokens: list[tuple[int, int, int, bool]]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """One llama_decode of (token, position, sequence, wants logits) rows: the tapped layer
        inputs of every row [rows, n_taps * n_embd] and the logits of the rows that want them."""
        lib = self._lib
        batch = lib.llama_batch_init(len(tokens), 0, 1)
        try:
            for i, (token, pos, seq, logits) in enumerate(tokens):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
                batch.seq_id[i][0], batch.logits[i] = seq, int(logits)
            batch.n_tokens = len(tokens)
            status = lib.llama_decode(self._ctx, batch)
            if status != 0:
                raise TargetError(f"{self.target}: llama_decode returned {status} while answering the prompts")
            taps = np.concatenate([
                np.ctypeslib.as_array(self._layer_inp["get"](self._ctx, lid),
                                      shape=(len(tokens), self.n_embd)).astype(np.float16)
                for lid in self.taps], axis=1)
            logits = {i: np.ctypeslib.as_array(lib.llama_get_logits_ith(self._ctx, i), shape=(self.n_vocab,)).copy()
                      for i, row in enumerate(tokens) if row[3]}
            return taps, logits
        finally:
            lib.llama_batch_free(batch)

    def _top(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """The k most likely tokens, their log-probabilities, and the greedy token (the first maximum)."""
        shifted = logits - logits.max()
        logp = shifted - np.log(np.exp(shifted).sum())
        top = np.argpartition(-logits, self.top_k)[:self.top_k]
        top = top[np.argsort(-logits[top], kind="stable")]
        return top.astype(np.int32), logp[top].astype(np.float16), int(np.argmax(logits))

    def answer(self, prompts: Sequence[list[int]], new_tokens: int) -> list[Answer]:
        """Greedy answers of at most `new_tokens` (stopping at an end-of-generation token) to up
        to n_seq prompts at once, with the teacher's view of every token fed."""
        if len(prompts) > self.n_seq:
            return [answer for i in range(0, len(prompts), self.n_seq)
                    for answer in self.answer(prompts[i:i + self.n_seq], new_tokens)]
        lib = self._lib
        lib.llama_memory_clear(lib.llama_get_memory(self._ctx), True)
        ids = [list(p) for p in prompts]
        taps: list[list[np.ndarray]] = [[] for _ in prompts]
        tops: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in prompts]
        nothing = (np.zeros(self.top_k, np.int32), np.zeros(self.top_k, np.float16))
        pending, broken = {}, set()
        for seq, prompt in enumerate(prompts):
            rows, logits = self._decode([(t, i, seq, i == len(prompt) - 1) for i, t in enumerate(prompt)])
            if not np.isfinite(logits[len(prompt) - 1]).all():
                broken.add(seq)
                continue
            taps[seq].append(rows)
            top_ids, top_logp, token = self._top(logits[len(prompt) - 1])
            tops[seq] += [nothing] * (len(prompt) - 1) + [(top_ids, top_logp)]
            pending[seq] = token
        for _ in range(new_tokens):
            for seq, token in list(pending.items()):
                ids[seq].append(token)
                if self._is_eog(token) or len(ids[seq]) - len(prompts[seq]) >= new_tokens:
                    del pending[seq]  # its last token is a label only, never fed
            if not pending:
                break
            order = list(pending)
            rows, logits = self._decode([(pending[s], len(ids[s]) - 1, s, True) for s in order])
            for i, seq in enumerate(order):
                if not np.isfinite(logits[i]).all():
                    broken.add(seq)
                    del pending[seq]
                    continue
                taps[seq].append(rows[i:i + 1])
                top_ids, top_logp, pending[seq] = self._top(logits[i])
                tops[seq].append((top_ids, top_logp))
        answers = [None if s in broken else
                   Answer(ids=ids[s], prompt_len=len(prompts[s]), taps=np.concatenate(taps[s]),
                          top_ids=np.stack([t[0] for t in tops[s]]), top_logp=np.stack([t[1] for t in tops[s]]))
                   for s in range(len(prompts))]
        # A conversation whose logits went non-finite in a batched step is answered again alone, and one
        # that fails alone too is an error rather than a NaN in the store.
        if broken and len(prompts) == 1:
            raise TargetError(f"{self.target}: llama.cpp computed non-finite logits answering a prompt; "
                              "the target's weights or this build cannot be taught from")
        for seq in sorted(broken):
            answers[seq] = self.answer([prompts[seq]], new_tokens)[0]
            self.answered_alone += 1
        return answers

