"""sweep: concurrency 1, 2, 4, 8, 16: aggregate output tokens/s and ITL p95 at each level
(the throughput-latency frontier)."""

from __future__ import annotations

import argparse
import sys

from uma_serve.bench import common
from uma_serve.bench.report import TOKEN_HEADER, RunDir, plot_frontier, token_rows
from uma_serve.bench.targets import RequestSpec, Target
from uma_serve.bench.workloads import Workload

NAME = "sweep"
KEY_METRICS = [
    ("c1.output_tok_per_s", "higher"),
    ("c4.output_tok_per_s", "higher"),
    ("c4.itl_p95_ms", "lower"),
    ("c4.ttft_p50_ms", "lower"),
    ("best_output_tok_per_s", "higher"),
]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    common.add_common(ap)
    ap.add_argument("--levels", help="concurrency levels (default 1,2,4,8,16; quick 1,2,4)")
    ap.add_argument("--rounds", type=int, help="requests per stream (default 2, quick 1)")
    ap.add_argument("--max-tokens", type=int, help="tokens per request (default 64, quick 16)")


def levels_of(args: argparse.Namespace) -> list[int]:
    if args.levels:
        return [int(x) for x in args.levels.split(",")]
    return [1, 2, 4] if args.quick else [1, 2, 4, 8, 16]


async def warm_up(target: Target, args: argparse.Namespace) -> None:
    """The first level's requests once, unmeasured, other prompts than the measured ones (no
    prefix of theirs cached): a fresh server's first requests at a shape build its graphs (a
    lone stream's first request on an H100 waited ~46 ms for its first token, later ones
    10-14 ms through the gateway), as llama-batched-bench's first row warms the device up
    and is dropped."""
    c = levels_of(args)[0]
    specs = _specs(Workload(args.seed + 1), args, c, "warm")
    await common.run_concurrent(target, specs, c, "warm-up")


def _specs(wl: Workload, args: argparse.Namespace, count: int, tag: str) -> list[RequestSpec]:
    """``count`` requests of the level's kind: a chat prompt each, max_tokens as configured."""
    n = args.max_tokens or (16 if args.quick else 64)
    return [RequestSpec(wl.chat_prompt(40), n, seed=args.seed + i, tag=tag) for i in range(count)]


async def measure(target: Target, args: argparse.Namespace, run: RunDir) -> dict:
    wl = Workload(args.seed)
    rounds = args.rounds or (1 if args.quick else 2)
    out: dict = {}
    rows, csv_rows, failed = [], [], 0
    for c in levels_of(args):
        specs = _specs(wl, args, c * rounds, f"c{c}")
        results, dt = await common.run_concurrent(target, specs, c, f"concurrency {c}")
        s = common.summarize(results, dt).to_dict()
        out[f"c{c}"] = s
        failed += s["failed"]
        rows += token_rows(target.name, results, results[0].t_send)
        csv_rows.append(
            [
                c,
                s["output_tok_per_s"],
                s["itl_p50_ms"],
                s["itl_p95_ms"],
                s["ttft_p50_ms"],
                s["ttft_p95_ms"],
                s["request_per_s"],
            ]
        )
    run.write_csv("tokens.csv", TOKEN_HEADER, rows)
    run.write_csv(
        "sweep.csv",
        [
            "concurrency",
            "output_tok_per_s",
            "itl_p50_ms",
            "itl_p95_ms",
            "ttft_p50_ms",
            "ttft_p95_ms",
            "request_per_s",
        ],
        csv_rows,
    )
    plot_frontier(run, "frontier.png", {target.name: frontier(out)})
    out["best_output_tok_per_s"] = max((v["output_tok_per_s"] or 0) for v in out.values())
    out["failed"] = failed
    return out


def frontier(summary: dict) -> list[tuple[int, float, float]]:
    return [
        (int(k[1:]), v["output_tok_per_s"], v["itl_p95_ms"])
        for k, v in summary.items()
        if k.startswith("c") and k[1:].isdigit()
    ]


def run(args: argparse.Namespace) -> int:
    return common.run_scenario(args, sys.modules[__name__])
