"""agent-chain: K dependent short calls (each prompt carries the previous answer), alone and
under N background decoders (long generations); the makespan slowdown factor."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass

from uma_serve.bench import common
from uma_serve.bench.report import TOKEN_HEADER, RunDir, token_rows
from uma_serve.bench.stats import ratio
from uma_serve.bench.targets import RequestResult, RequestSpec, Target
from uma_serve.bench.workloads import Workload

NAME = "agent-chain"
KEY_METRICS = [
    ("alone.makespan_ms", "lower"),
    ("loaded.makespan_ms", "lower"),
    ("slowdown", "lower"),
    ("loaded.ttft_p50_ms", "lower"),
    ("decoders.output_tok_per_s", "higher"),
]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    common.add_common(ap)
    ap.add_argument("--steps", type=int, help="chain length K (default 5, quick 3)")
    ap.add_argument("--step-tokens", type=int, help="tokens per call (default 24, quick 8)")
    ap.add_argument("--decoders", type=int, help="background decoders N (default 3, quick 2)")
    ap.add_argument("--decoder-tokens", type=int, default=1024, help="background length cap")
    common.add_label_background(ap, "the long decoders")


async def chain(target: Target, args, wl: Workload, tag: str) -> tuple[list[RequestResult], float]:
    steps = args.steps or (3 if args.quick else 5)
    n = args.step_tokens or (8 if args.quick else 24)
    results: list[RequestResult] = []
    answer = "Plan: gather the facts, then write a summary."
    progress = common.bar(steps, tag)
    t0 = time.perf_counter()
    for k in range(steps):
        spec = RequestSpec(wl.follow_up(answer, k), n, seed=args.seed + k, tag=f"{tag}-{k}")
        r = await target.generate(spec)
        results.append(r)
        progress.update(1)
        answer = r.text or answer
    progress.close()
    return results, time.perf_counter() - t0


async def measure(target: Target, args: argparse.Namespace, run: RunDir) -> dict:
    wl = Workload(args.seed)
    alone, alone_s = await chain(target, args, wl, "alone")
    n_dec = args.decoders or (2 if args.quick else 3)
    loaded = await _under_decoders(target, args, wl, n_dec)
    _write_csvs(run, target.name, alone, loaded)
    _plot(run, target.name, alone, loaded.results)
    a = common.summarize(alone, alone_s).to_dict()
    lo = common.summarize(loaded.results, loaded.seconds).to_dict()
    a["makespan_ms"] = round(alone_s * 1000, 1)
    lo["makespan_ms"] = round(loaded.seconds * 1000, 1)
    # background decoders were cancelled: count the tokens they streamed meanwhile
    return {
        "alone": a,
        "loaded": lo,
        "slowdown": ratio(lo["makespan_ms"], a["makespan_ms"]),
        "decoders": {
            "count": n_dec,
            "output_tok_per_s": round(sum(loaded.decoder_tokens) / loaded.window_s, 2),
        },
        "failed": a["failed"] + lo["failed"],
        "errors": common.errors(alone + loaded.results),
    }


@dataclass
class _Loaded:
    """The chain run under background decoders."""

    results: list[RequestResult]
    seconds: float  # the chain's makespan
    t_start: float  # when the decoders started: the loaded rows' time origin
    decoder_tokens: list[int]  # tokens each decoder streamed before it was cancelled
    window_s: float  # from the decoders' start to the chain's end


async def _under_decoders(target: Target, args, wl: Workload, n_dec: int) -> _Loaded:
    """Start ``n_dec`` long decoders, run the chain once each has its first token, then
    cancel them."""
    started = [asyncio.Event() for _ in range(n_dec)]
    bg: list[RequestResult] = []
    dec_tokens = [0] * n_dec
    t_start = time.perf_counter()
    tasks = [
        asyncio.create_task(_decoder(target, args, wl, i, started[i], dec_tokens, bg))
        for i in range(n_dec)
    ]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 120)
    loaded, loaded_s = await chain(target, args, wl, "loaded")
    decode_window = time.perf_counter() - t_start
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return _Loaded(loaded, loaded_s, t_start, dec_tokens, decode_window)


async def _decoder(
    target: Target,
    args,
    wl: Workload,
    i: int,
    started: asyncio.Event,
    dec_tokens: list[int],
    bg: list[RequestResult],
) -> None:
    """Background decoder ``i``: counts its tokens, sets ``started`` at its first."""
    spec = RequestSpec(
        wl.chat_prompt(40),
        args.decoder_tokens,
        qos=common.bulk_label(args),
        seed=args.seed + 500 + i,
        tag=f"decoder-{i}",
    )

    def on_token(_t: float) -> None:
        dec_tokens[i] += 1
        started.set()

    bg.append(await target.generate(spec, on_token=on_token))
    started.set()  # ended or failed before its first token: do not wait for it


def _write_csvs(run: RunDir, server: str, alone: list[RequestResult], loaded: _Loaded) -> None:
    """tokens.csv (every token of both phases) and chain.csv (one row per step)."""
    rows = token_rows(server, alone, alone[0].t_send) + token_rows(
        server, loaded.results, loaded.t_start
    )
    run.write_csv("tokens.csv", TOKEN_HEADER, rows)
    run.write_csv(
        "chain.csv",
        ["phase", "step", "ttft_ms", "e2e_ms", "tokens"],
        [
            [
                r.spec.tag.split("-")[0],
                k,
                r.token_ms[0] if r.token_ms else None,
                r.token_ms[-1] if r.token_ms else None,
                r.n_tokens,
            ]
            for rs in (alone, loaded.results)
            for k, r in enumerate(rs)
        ],
    )


def _plot(run: RunDir, server: str, alone, loaded) -> None:
    from uma_serve.bench.report import plot_bars

    plot_bars(
        run,
        "chain.png",
        f"agent-chain on {server}: per-step end-to-end (ms)",
        {
            f"step {k}": {"alone": _e2e(a), "loaded": _e2e(b)}
            for k, (a, b) in enumerate(zip(alone, loaded, strict=False))
        },
    )


def _e2e(r: RequestResult) -> float | None:
    return r.token_ms[-1] if r.token_ms else None


def run(args: argparse.Namespace) -> int:
    return common.run_scenario(args, sys.modules[__name__])
