"""bench ceiling: llama-batched-bench's table read right, and the ratios per level."""

from __future__ import annotations

from uma_serve.bench.ceiling import batched_bench_args, parse_batched_bench, table
from uma_serve.bench.servers import ServerShape

# llama-batched-bench's output on an H100 (Gemma 3 270M, CUDA build of llama.cpp's sources)
OUTPUT = """
main: n_kv_max = 131072, n_batch = 2048, n_ubatch = 512, flash_attn = -1, is_pp_shared = 0

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|    64 |    128 |    1 |    192 |    0.045 |  1426.76 |    0.146 |   877.79 |    0.191 |  1006.93 |
|    64 |    128 |   16 |   3072 |    0.024 | 43419.27 |    0.394 |  5198.29 |    0.418 |  7357.03 |
|    64 |    128 |   64 |  12288 |    0.073 | 55924.20 |    0.811 | 10102.07 |    0.884 | 13897.86 |

llama_perf_context_print:        load time =     312.11 ms
"""


def test_generation_throughput_by_streams() -> None:
    assert parse_batched_bench(OUTPUT) == {1: 877.79, 16: 5198.29, 64: 10102.07}


def test_ratios_per_level() -> None:
    servers = {
        "uma": {"c1": {"output_tok_per_s": 702.2}, "c16": {"output_tok_per_s": 2599.1}},
        "llama-server": {"c1": {"output_tok_per_s": 390.1}},
    }
    ceiling = {1: 877.79, 16: 5198.29, 64: 10102.07}
    rows = table([1, 16, 64], ceiling, servers, {1: 877.79, 16: 3249.0})
    assert rows[0] == [1, 877.79, 877.79, 702.2, 0.8, 0.8, 390.1, 1.8]
    assert rows[1] == [16, 5198.29, 3249.0, 2599.1, 0.5, 0.8, None, None]
    assert rows[2] == [64, 10102.07, None, None, None, None, None, None]


def test_the_ceiling_runs_the_servers_shape() -> None:
    shape = ServerShape(model="m.gguf", n_seq=64, n_ctx=131072, threads=4, n_gpu_layers=-1)
    args = batched_bench_args(shape, [1, 16, 64], 64, 128)
    pairs = dict(zip(args[::2], args[1::2], strict=True))
    assert pairs["-m"] == "m.gguf" and pairs["-c"] == "131072" and pairs["-ngl"] == "99"
    assert pairs["-npl"] == "1,16,64" and pairs["-ntg"] == "128" and pairs["-t"] == "4"
    # a context too small for the levels grows to hold every stream's prompt and tokens
    small = ServerShape(model="m.gguf", n_ctx=4096)
    pairs = dict(zip(*[iter(batched_bench_args(small, [64], 64, 128))] * 2, strict=True))
    assert pairs["-c"] == str(64 * 192)


def test_the_unified_ceiling_keeps_one_kv_buffer_as_uma_does() -> None:
    """-kvu: llama-batched-bench with one KV buffer for every sequence (UMA Serve's layout);
    without it, each sequence has its own stream (its default)."""
    shape = ServerShape(model="m.gguf", n_ctx=131072, n_gpu_layers=-1)
    assert "-kvu" in batched_bench_args(shape, [64], 64, 128, unified=True)
    assert "-kvu" not in batched_bench_args(shape, [64], 64, 128)
