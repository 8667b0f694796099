"""long-ctx: prompt lengths stepping up to the context (1k, 2k, 4k, 8k, ...): decode tokens/s
and ITL p95 per length; CSV ctx,tps,itl_p95_ms. A started server gets one sequence with the
whole context (--n-seq 1) unless told otherwise."""

from __future__ import annotations

import argparse
import sys

from uma_serve.bench import common
from uma_serve.bench.report import TOKEN_HEADER, RunDir, token_rows
from uma_serve.bench.stats import percentile
from uma_serve.bench.targets import RequestSpec, Target
from uma_serve.bench.workloads import Workload

NAME = "long-ctx"
KEY_METRICS = [("max_ctx_tps", "higher"), ("max_ctx_itl_p95_ms", "lower")]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    common.add_common(ap)
    ap.add_argument(
        "--steps",
        help="comma-separated prompt lengths (default 1024,2048,4096,8192 "
        "capped to the context; quick 256,512,1024)",
    )
    ap.add_argument("--max-tokens", type=int, help="tokens generated (default 64, quick 16)")
    ap.add_argument("--long-n-seq", type=int, default=1, help="sequences for a started server")


def shape_overrides(args: argparse.Namespace) -> dict:
    return {"n_seq": args.long_n_seq, "n_ctx": 2048 if args.quick else args.n_ctx}


def steps_of(args: argparse.Namespace) -> list[int]:
    if args.steps:
        return [int(x) for x in args.steps.split(",")]
    return [256, 512, 1024] if args.quick else [1024, 2048, 4096, 8192]


async def measure(target: Target, args: argparse.Namespace, run: RunDir) -> dict:
    wl = Workload(args.seed)
    ov = shape_overrides(args)
    per_seq = ov["n_ctx"] // ov["n_seq"]
    n = args.max_tokens or (16 if args.quick else 64)
    rows, results, points = [], [], []
    progress = common.bar(len(steps_of(args)), "long-ctx")
    for ctx in steps_of(args):
        # the top step fills the sequence: leave room for the answer and the estimate's error
        prompt_len = min(ctx, int((per_seq - n - 16) * 0.85))
        spec = RequestSpec(wl.document(prompt_len), n, seed=args.seed, tag=f"ctx{ctx}")
        r = await target.generate(spec)
        progress.update(1)
        results.append(r)
        decode_s = (r.token_ms[-1] - r.token_ms[0]) / 1000.0 if len(r.token_ms) > 1 else 0
        tps = (r.n_tokens - 1) / decode_s if decode_s > 0 else None
        gaps = [b - a for a, b in zip(r.token_ms, r.token_ms[1:], strict=False)]
        p95 = percentile(gaps, 95)
        ptoks = r.prompt_tokens or common.approx_tokens(spec.prompt)
        points.append(
            {
                "ctx": ctx,
                "prompt_tokens": ptoks,
                "tps": tps,
                "itl_p95_ms": p95,
                "ttft_ms": r.token_ms[0] if r.token_ms else None,
                "ok": r.ok,
            }
        )
        rows.append([ctx, _r(tps), _r(p95)])
    progress.close()
    run.write_csv("long_ctx.csv", ["ctx", "tps", "itl_p95_ms"], rows)
    run.write_csv("tokens.csv", TOKEN_HEADER, token_rows(target.name, results, results[0].t_send))
    _plot(run, target.name, points)
    last = points[-1]
    failed = sum(1 for pt in points if not pt["ok"])
    return {
        "points": points,
        "max_ctx_tps": _r(last["tps"]),
        "max_ctx_itl_p95_ms": _r(last["itl_p95_ms"]),
        "failed": failed,
        "errors": common.errors(results),
    }


def _plot(run: RunDir, server: str, points: list[dict]) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [pt["prompt_tokens"] for pt in points]
    ax.plot(xs, [pt["tps"] or 0 for pt in points], marker="o", color="C0", label="tokens/s")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("decode tokens/s", color="C0")
    ax2 = ax.twinx()
    ax2.plot(xs, [pt["itl_p95_ms"] or 0 for pt in points], marker="s", color="C1")
    ax2.set_ylabel("ITL p95 (ms)", color="C1")
    ax.set_title(f"long-ctx on {server}")
    ax.grid(True, alpha=0.3)
    run.savefig(fig, "long_ctx.png")


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def run(args: argparse.Namespace) -> int:
    return common.run_scenario(args, sys.modules[__name__])
