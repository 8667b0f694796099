"""storm: the interactive stream while K clients keep sending long unique documents
(prefill-only storm: long prompts, short answers). Interactive figures also as ratios to solo;
background prompt tokens/s and completed requests."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from uma_serve.bench import common, solo
from uma_serve.bench.report import TOKEN_HEADER, RunDir, plot_gaps, token_rows
from uma_serve.bench.stats import percentile, ratio, slow_share
from uma_serve.bench.targets import RequestResult, RequestSpec, Target
from uma_serve.bench.workloads import Workload

NAME = "storm"
RATIO_KEYS = (
    "ttft_p50_ms",
    "ttf5_p50_ms",
    "itl_p50_ms",
    "itl_p95_ms",
    "itl_max_ms",
    "worst_pause_max_ms",
)
KEY_METRICS = [
    ("interactive.ttft_p50_ms", "lower"),
    ("interactive.ttf5_p50_ms", "lower"),
    ("interactive.itl_p95_ms", "lower"),
    ("interactive.worst_pause_max_ms", "lower"),
    ("ratio_to_solo.itl_p95_ms", "lower"),
    ("ratio_to_solo.worst_pause_max_ms", "lower"),
    ("rounds.median", "lower"),
    ("background.prompt_tok_per_s", "higher"),
    ("background.completed", "higher"),
]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    solo.add_arguments(ap)
    ap.add_argument("--clients", type=int, help="storm clients K (default 3, quick 2)")
    ap.add_argument("--doc-tokens", type=int, help="document length (default 1500, quick 250)")
    ap.add_argument("--answer-tokens", type=int, default=8, help="background answer length")
    ap.add_argument("--lead-s", type=float, default=1.0, help="storm head start (s)")
    ap.add_argument(
        "--drain-s", type=float, default=300.0, help="bound on waiting for background to finish"
    )
    common.add_label_background(ap, "the storm's documents")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="solo and storm phases, alternating this many times; figures pool the rounds "
        "(a p95 from one phase of 3 requests moves with the host's hiccups, ±30%% on an H100)",
    )
    ap.add_argument(
        "--bulk-only",
        type=float,
        metavar="S",
        help="no chat: only the K clients' documents for S seconds (what bulk prefill does "
        "alone; compare with --umad-arg=--policy --umad-arg= for the guards off)",
    )
    ap.set_defaults(requests=3)  # interactive requests alone and under the storm


async def background_loop(
    target: Target,
    wl: Workload,
    args: argparse.Namespace,
    k: int,
    out: list[RequestResult],
    stop: asyncio.Event,
) -> None:
    doc_tokens = args.doc_tokens or (250 if args.quick else 1500)
    i = 0
    while not stop.is_set():
        spec = RequestSpec(
            wl.document(doc_tokens),
            args.answer_tokens,
            qos=common.bulk_label(args),
            seed=args.seed + 1000 * (k + 1) + i,
            tag=f"background-{k}",
        )
        out.append(await target.generate(spec))
        i += 1


async def under_load(
    target, args, wl, loops, foreground=None
) -> tuple[list[RequestResult], list, float, float]:
    """Start the background loops, wait lead_s, run the interactive requests (``foreground()``
    when given, else solo's), then stop
    sending background work and let what is in flight finish (every background request must
    complete: the load's duration runs to the last one, so background tokens/s is the work
    done over the whole storm, not what slipped in beside the interactive stream).
    Returns (interactive results, background results, load duration s, t_load_start)."""
    bg: list[RequestResult] = []
    stop = asyncio.Event()
    t_start = time.perf_counter()
    tasks = [
        asyncio.create_task(loop(target, wl, args, k, bg, stop)) for k, loop in enumerate(loops)
    ]
    await asyncio.sleep(args.lead_s)
    if foreground is not None:
        results = await foreground()
    else:
        results, _ = await solo.run_solo(target, args, wl, tag="interactive")
    stop.set()
    _, pending = await asyncio.wait(tasks, timeout=args.drain_s)
    for t in pending:  # not finished within the drain bound: counted as failed
        t.cancel()
        spec = RequestSpec("", 0, tag="background-unfinished")
        bg.append(RequestResult(spec, t_start, error=f"unfinished after {args.drain_s:g} s drain"))
    await asyncio.gather(*tasks, return_exceptions=True)
    return results, bg, time.perf_counter() - t_start, t_start


async def bulk_only(target: Target, args: argparse.Namespace, wl: Workload, k: int) -> dict:
    """The documents alone for ``args.bulk_only`` seconds, then what is in flight finishes."""
    bg: list[RequestResult] = []
    stop = asyncio.Event()
    t0 = time.perf_counter()
    tasks = [asyncio.create_task(background_loop(target, wl, args, i, bg, stop)) for i in range(k)]
    await asyncio.sleep(args.bulk_only)
    stop.set()
    await asyncio.gather(*tasks)
    done = [r for r in bg if r.ok]
    s = common.summarize(done, time.perf_counter() - t0).to_dict()
    return {
        "background": {
            "completed": len(done),
            "prompt_tokens": s["prompt_tokens"],
            "prompt_tok_per_s": s["prompt_tok_per_s"],
            "ttft_p50_ms": s["ttft_p50_ms"],
        },
        "failed": len(bg) - len(done),
        "errors": common.errors(bg),
    }


async def measure(target: Target, args: argparse.Namespace, run: RunDir) -> dict:
    """Solo then storm, ``rounds`` times: alternating phases share the machine's drift."""
    wl = Workload(args.seed)
    k = args.clients or (2 if args.quick else 3)
    if args.bulk_only:
        return await bulk_only(target, args, wl, k)
    base: list[RequestResult] = []
    inter: list[RequestResult] = []
    bg: list[RequestResult] = []
    pairs: list[float | None] = []  # each round's storm ITL p95 over its solo's
    base_dt = dt = 0.0
    t_start: float | None = None
    for _ in range(max(1, args.rounds)):
        b, b_dt = await solo.run_solo(target, args, wl)
        i, g, g_dt, t0 = await under_load(target, args, wl, [background_loop] * k)
        pairs.append(ratio(itl_p95(i), itl_p95(b)))
        base += b
        inter += i
        bg += g
        base_dt += b_dt
        dt += g_dt
        t_start = t0 if t_start is None else t_start
    out = report(target, run, base, base_dt, inter, bg, dt, t_start, "storm")
    known = [x for x in pairs if x is not None]
    out["rounds"] = {"n": len(pairs), "itl_p95_ratio": pairs, "median": percentile(known, 50)}
    return out


def itl_p95(results: list[RequestResult]) -> float | None:
    return common.summarize(results, 0.0).to_dict()["itl_p95_ms"]


def report(target, run, base, base_dt, inter, bg, dt, t_start, title) -> dict:
    rows = token_rows(target.name, base, base[0].t_send)
    rows += token_rows(target.name, inter + bg, t_start)
    run.write_csv("tokens.csv", TOKEN_HEADER, rows)
    streams = []
    for r in inter + bg:
        t0 = (r.t_send - t_start) * 1000.0
        if len(r.token_ms) > 1:
            streams.append(
                (
                    f"{r.spec.tag}",
                    [t0 + x for x in r.token_ms[1:]],
                    [b - a for a, b in zip(r.token_ms, r.token_ms[1:], strict=False)],
                )
            )
    plot_gaps(run, "gaps.png", f"{title} on {target.name}: inter-token gaps per stream", streams)
    b = common.summarize(base, base_dt).to_dict()
    i = common.summarize(inter, dt).to_dict()
    done = [r for r in bg if r.ok]
    bgs = common.summarize(done, dt).to_dict()
    return {
        "solo": b,
        "interactive": i,
        "ratio_to_solo": {key: ratio(i[key], b[key]) for key in RATIO_KEYS},
        "slow_gaps": slow_gaps(base, inter, b["itl_p50_ms"]),
        "background": {
            "completed": len(done),
            "failed": len(bg) - len(done),
            "prompt_tokens": bgs["prompt_tokens"],
            "prompt_tok_per_s": bgs["prompt_tok_per_s"],
            "output_tokens": bgs["output_tokens"],
            "ttft_p50_ms": bgs["ttft_p50_ms"],
        },
        "failed": b["failed"] + i["failed"] + len(bg) - len(done),
        "errors": common.errors(base + inter + bg),
    }


def slow_gaps(
    base: list[RequestResult], inter: list[RequestResult], solo_p50: float | None
) -> dict[str, float | None] | None:
    """Share of gaps over twice solo's median, in each phase, with and without each request's
    first 3 gaps (after its prompt tick a GPU runs ~2 decode ticks without its CUDA graph, in
    both phases)."""
    if not solo_p50:
        return None
    over = 2 * solo_p50
    out: dict[str, float | None] = {"over_ms": round(over, 3)}
    for name, results in (("solo", base), ("interactive", inter)):
        streams = [r.token_ms for r in results if r.ok]
        out[name] = slow_share(streams, over)
        out[f"{name}_after_3"] = slow_share(streams, over, skip=3)
    return out


def run(args: argparse.Namespace) -> int:
    return common.run_scenario(args, sys.modules[__name__])
