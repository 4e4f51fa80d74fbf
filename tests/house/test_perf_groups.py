"""The perf categories of `make bench` section (e) (benchmarks/bench.py PERF_GROUPS): each sample of
llama-server goes to the kind of work its symbol does. Symbols as `perf report --sort dso,sym`
prints them for the pinned CPU build."""

import pytest

from benchmarks.bench import PERF_GROUPS, perf_group


@pytest.mark.parametrize("dso, symbol, group", [
    ("libggml-cpu.so.0.25.3", "(anonymous namespace)::tinyBLAS<16, float __vector(16), float __vector(16), "
     "unsigned short, unsigned short, float>::gemm_bloc<4, 6>", "matrix multiply"),
    ("libggml-cpu.so.0.25.3", "ggml_vec_dot_f16", "matrix multiply"),
    ("libggml-cpu.so.0.25.3", "ggml_compute_forward_flash_attn_ext", "attention (flash attn, softmax, exp)"),
    ("libm.so.6", "__expf_fma", "attention (flash attn, softmax, exp)"),
    ("libllama-common.so.0.5.0", "common_sampler_sample", "sampling"),
    ("libllama.so.0.5.0", "std::__adjust_heap<llama_token_data*, long, llama_token_data, ...>", "sampling"),
    ("libggml-cpu.so.0.25.3", "ggml_compute_forward_top_k", "sampling"),
    ("libggml-cpu.so.0.25.3", "ggml_compute_forward_pad", "copies, fills (cpy, concat, pad, rows, memcpy, memset)"),
    ("libc.so.6", "__memset_avx512_unaligned_erms", "copies, fills (cpy, concat, pad, rows, memcpy, memset)"),
    ("libgomp.so.1.0.0", "gomp_barrier_wait_end", "thread sync (barriers, spinning, futex)"),
    ("[kernel.kallsyms]", "finish_task_switch.isra.0", "thread sync (barriers, spinning, futex)"),
    ("libggml-base.so.0.25.3", "ggml_gallocr_reserve_n_impl", "graph build + allocation"),
    ("libllama.so.0.5.0", "llama_model_dflash::graph<false>::graph", "graph build + allocation"),
    ("libggml-cpu.so.0.25.3", "ggml_compute_forward_rms_norm_mul_fused", "other ggml ops (norm, rope, add, act)"),
    ("libm.so.6", "__sincosf_fma", "other"),
])
def test_symbols_fall_in_their_category(dso, symbol, group):
    assert perf_group(dso, symbol) == group


def test_every_category_has_keys_and_a_distinct_name():
    names = [name for name, _ in PERF_GROUPS]
    assert len(set(names)) == len(names) and "other" not in names
    assert all(keys for _, keys in PERF_GROUPS)
