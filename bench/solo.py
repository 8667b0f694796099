"""solo: one interactive stream alone, the baseline every ratio refers to."""

from __future__ import annotations

import argparse

from uma_serve.bench import common
from uma_serve.bench.report import TOKEN_HEADER, RunDir, plot_gaps, token_rows
from uma_serve.bench.targets import RequestResult, RequestSpec, Target
from uma_serve.bench.workloads import Workload

NAME = "solo"
KEY_METRICS = [
    ("ttft_p50_ms", "lower"),
    ("ttf5_p50_ms", "lower"),
    ("itl_p50_ms", "lower"),
    ("itl_p95_ms", "lower"),
    ("worst_pause_max_ms", "lower"),
    ("output_tok_per_s", "higher"),
]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    common.add_common(ap)
    ap.add_argument("--requests", type=int, help="sequential requests (default 5, quick 2)")
    ap.add_argument("--max-tokens", type=int, help="tokens per request (default 64, quick 16)")
    ap.add_argument("--prompt-tokens", type=int, default=40, help="prompt length (approx.)")


def interactive_specs(args: argparse.Namespace, wl: Workload, tag: str) -> list[RequestSpec]:
    n = args.requests or (2 if args.quick else 5)
    max_tokens = args.max_tokens or (16 if args.quick else 64)
    return [
        RequestSpec(wl.chat_prompt(args.prompt_tokens), max_tokens, seed=args.seed + i, tag=tag)
        for i in range(n)
    ]


async def run_solo(
    target: Target, args: argparse.Namespace, wl: Workload, tag: str = "solo"
) -> tuple[list[RequestResult], float]:
    return await common.run_concurrent(target, interactive_specs(args, wl, tag), 1, tag)


async def measure(target: Target, args: argparse.Namespace, run: RunDir) -> dict:
    wl = Workload(args.seed)
    results, dt = await run_solo(target, args, wl)
    t0 = results[0].t_send
    rows = token_rows(target.name, results, t0)
    run.write_csv("tokens.csv", TOKEN_HEADER, rows)
    plot_gaps(
        run,
        "gaps.png",
        f"solo on {target.name}: inter-token gaps",
        [
            (
                f"req {i}",
                [r[5] for r in rows if r[2] == i][1:],
                [r[6] for r in rows if r[2] == i][1:],
            )
            for i in range(len(results))
        ],
    )
    s = common.summarize(results, dt)
    return {**s.to_dict(), "errors": common.errors(results)}


def run(args: argparse.Namespace) -> int:
    import sys

    return common.run_scenario(args, sys.modules[__name__])
