"""bench ceiling: llama-batched-bench's table read right, and the ratios per level."""

from __future__ import annotations

import argparse

from uma_serve.bench.ceiling import (
    HEADER,
    Ceiling,
    batched_bench_args,
    parse_batched_bench,
    prompt_tokens,
    table,
)
from uma_serve.bench.servers import ServerShape

# llama-batched-bench's output on an H100 (Gemma 3 270M, CUDA build of llama.cpp's sources)
OUTPUT = """
main: n_kv_max = 131072, n_batch = 2048, n_ubatch = 512, flash_attn = -1, is_pp_shared = 0

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|    64 |    128 |    1 |    192 |    0.045 |  1426.76 |    0.180 |   711.11 |    0.225 |   853.33 |
|    64 |    128 |    1 |    192 |    0.011 |  5818.18 |    0.146 |   877.79 |    0.157 |  1222.93 |
|    64 |    128 |   16 |   3072 |    0.024 | 43419.27 |    0.394 |  5198.29 |    0.418 |  7357.03 |
|    64 |    128 |   64 |  12288 |    0.073 | 55924.20 |    0.811 | 10102.07 |    0.884 | 13897.86 |

llama_perf_context_print:        load time =     312.11 ms
"""


def test_each_levels_generation_and_with_prompts_throughput() -> None:
    """S_TG, and the same tokens over prompt and generation time (B x TG / T); a level's
    second row (the first one warmed the device up) is its figure."""
    assert parse_batched_bench(OUTPUT) == {
        1: Ceiling(877.79, round(128 / 0.157, 2)),
        16: Ceiling(5198.29, round(16 * 128 / 0.418, 2)),
        64: Ceiling(10102.07, round(64 * 128 / 0.884, 2)),
    }


def test_ratios_per_level() -> None:
    servers = {
        "uma": {"c1": {"output_tok_per_s": 702.2}, "c16": {"output_tok_per_s": 2599.1}},
        "llama-server": {"c1": {"output_tok_per_s": 390.1}},
    }
    ceiling = {1: Ceiling(877.79, 780.2), 16: Ceiling(5198.29, 4332.2), 64: Ceiling(10102.0, 0)}
    rows = table([1, 16, 64], ceiling, servers, {1: Ceiling(877.79, 702.2), 16: Ceiling(3249, 0)})
    assert all(len(r) == len(HEADER) for r in rows)
    assert rows[0] == [1, 877.79, 877.79, 780.2, 702.2, 702.2, 0.8, 0.8, 0.9, 1.0, 390.1, 1.8]
    assert rows[1] == [16, 5198.29, 3249, 4332.2, None, 2599.1, 0.5, 0.8, 0.6, None, None, None]
    assert rows[2] == [64, 10102.0, None, None, None, None, None, None, None, None, None, None]


def test_the_ceilings_prompts_are_as_long_as_umas() -> None:
    """The ceiling's prompts (-npp): the option, else UMA Serve's mean prompt in the run."""
    uma = {"c1": {"requests": 2, "prompt_tokens": 90}, "c16": {"requests": 32, "prompt_tokens":
           1440}, "failed": 0, "best_output_tok_per_s": 7.0}  # fmt: skip
    assert prompt_tokens(argparse.Namespace(prompt_tokens=None), {"uma": uma}) == 45
    assert prompt_tokens(argparse.Namespace(prompt_tokens=100), {"uma": uma}) == 100
    assert prompt_tokens(argparse.Namespace(prompt_tokens=None), {}) == 64


def test_the_ceiling_runs_the_servers_shape() -> None:
    shape = ServerShape(model="m.gguf", n_seq=64, n_ctx=131072, threads=4, n_gpu_layers=-1)
    args = batched_bench_args(shape, [1, 16, 64], 64, 128)
    pairs = dict(zip(args[::2], args[1::2], strict=True))
    assert pairs["-m"] == "m.gguf" and pairs["-c"] == "131072" and pairs["-ngl"] == "99"
    assert pairs["-npl"] == "1,1,16,64" and pairs["-ntg"] == "128" and pairs["-t"] == "4"
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


def test_a_server_runs_the_first_level_once_unmeasured_on_other_prompts(tmp_path) -> None:
    """As llama-batched-bench's first row is dropped, a server's first level runs once before
    the measured levels, with prompts none of the measured requests share."""
    import asyncio

    from uma_serve.bench import ceiling
    from uma_serve.bench.report import RunDir
    from uma_serve.bench.targets import RequestResult, RequestSpec, Target

    class Recording(Target):
        def __init__(self) -> None:
            self.sent: list[RequestSpec] = []

        async def generate(self, spec: RequestSpec, on_token=None) -> RequestResult:
            self.sent.append(spec)
            return RequestResult(spec, 0.0, token_ms=[1.0, 2.0], texts=["a", "b"])

    target = Recording()
    args = argparse.Namespace(levels="2,4", rounds=1, max_tokens=8, seed=0, quick=False)
    out = asyncio.run(ceiling.measure(target, args, RunDir("ceiling", str(tmp_path))))
    tags = [s.tag for s in target.sent]
    assert tags == ["warm"] * 2 + ["c2"] * 2 + ["c4"] * 4
    warm, measured = target.sent[:2], target.sent[2:]
    assert not {s.prompt for s in warm} & {s.prompt for s in measured}
    assert out["c2"]["requests"] == 2 and out["c4"]["requests"] == 4  # the warm-up uncounted
