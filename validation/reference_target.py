"""The HF target as the z-lab reference must run it to draft from what llama.cpp's drafter reads, for
targets where transformers differs from the pinned llama.cpp. Extra `dflash-gguf[reference]`.

Taps. A drafter's `target_layer_ids` id reads transformers' `hidden_states[id + 1]` (z-lab's
`extract_context_feature`), which llama.cpp records as the input of layer id + 1 (`t_layer_inp`).
For most targets the two are one tensor. DeepSeek-V4 keeps `hc_mult` hyper-connection streams
between layers, so transformers' hidden states are (batch, seq, hc_mult, hidden), except the last,
which is tied to the collapsed, normed `last_hidden_state`; the pinned deepseek4 graph
(src/models/deepseek4.cpp) records `build_hc_mean(inpL)`, the plain mean of the streams entering
layer il, for every il in 0..n_layer (n_layer: the last layer's streams, before `hc_head` and the
final norm).

Cache. z-lab's `dflash_generate` verifies a block through the target's cache, then crops the rejected
tokens off it. transformers' DeepSeek-V4 cache layers cannot be cropped: their sliding window is cut
on every update whatever `activate_past_recording` asks, and the compressors' buffers and emitted
entries are never rolled back (the next verify fails: "The size of tensor a (19) must match the size of
tensor b (31)"). Such a target is run from the start of the sequence on every call instead.
"""

from __future__ import annotations

from types import SimpleNamespace

# transformers model_type -> the pinned llama.cpp graph that records the mean of its streams
STREAM_MEAN_TARGETS = {"deepseek_v4": "deepseek4"}
# transformers model_types whose cache cannot be rolled back to a shorter sequence
UNCROPPABLE_CACHE_TARGETS = frozenset({"deepseek_v4"})


def _model_type(target) -> str | None:
    return getattr(target.config, "model_type", None)


def tap_like_llama(target):
    """`target` (a loaded transformers model), its forward made to return hidden states as llama.cpp
    taps them; a target whose hidden states are already that is returned as it is."""
    if _model_type(target) not in STREAM_MEAN_TARGETS:
        return target
    # hidden_states[-1]: the last layer's streams rather than the collapsed, normed output
    target.config.tie_last_hidden_states = False
    target.register_forward_hook(_mean_of_streams)
    return target


def _mean_of_streams(_module, _args, output):
    states = getattr(output, "hidden_states", None)
    if states is not None:
        output.hidden_states = tuple(h.mean(dim=2) if h is not None and h.dim() == 4 else h for h in states)
    return output


def for_generation(target):
    """The target z-lab's generation loop (and `dspark_generate`) is given: `target` itself, or a
    `Recomputing` one where its cache cannot be rolled back."""
    return Recomputing(target) if _model_type(target) in UNCROPPABLE_CACHE_TARGETS else target


class Recomputing:
    """A target that runs the whole sequence on every call. The loop makes its cache from `config`
    (None: plain layers, made on first use) and hands it back on every call; that cache holds the token
    ids fed so far, so the loop's crop rolls the sequence back exactly."""

    config = None

    def __init__(self, model) -> None:
        self.model = model
        self.device = model.device
        self.lm_head = getattr(model, "lm_head", None)

    def get_input_embeddings(self):
        return self.model.get_input_embeddings()

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()

    def __call__(self, input_ids, past_key_values=None, logits_to_keep: int = 0, output_hidden_states: bool = False,
                 **_ignored):  # position_ids: those of the new tokens after the kept ones, as here
        n = input_ids.shape[1]
        ids = input_ids
        if past_key_values is not None:
            kept, _ = past_key_values.update(input_ids[:, None, :, None], input_ids[:, None, :, None], 0)
            ids = kept[:, 0, :, 0]
        out = self.model(ids, use_cache=False, output_hidden_states=output_hidden_states)
        return SimpleNamespace(logits=out.logits[:, -(logits_to_keep or n):],
                               hidden_states=tuple(h[:, -n:] for h in out.hidden_states) if output_hidden_states
                               else None)
