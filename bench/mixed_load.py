"""mixed-load: 3 interactive sessions (a few turns each) plus 1 long document summary in the
background; per-token CSV (session_id,token_idx,ts_ms,is_interactive), ITL p50/p95 per class.

The sessions first run alone (no document): that is the "solo" the loaded ratios refer to
here, the same interactive load without the background work, as storm's solo is its one
interactive stream without the storm."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from uma_serve.bench import common
from uma_serve.bench.report import RunDir, plot_gaps
from uma_serve.bench.stats import gaps, ratio
from uma_serve.bench.storm import RATIO_KEYS
from uma_serve.bench.targets import RequestResult, RequestSpec, Target
from uma_serve.bench.workloads import Workload

NAME = "mixed-load"
KEY_METRICS = [
    ("interactive.itl_p50_ms", "lower"),
    ("interactive.itl_p95_ms", "lower"),
    ("interactive.worst_pause_max_ms", "lower"),
    ("alone.itl_p95_ms", "lower"),
    ("ratio_to_alone.itl_p95_ms", "lower"),
    ("background.itl_p95_ms", "lower"),
    ("background.e2e_max_ms", "lower"),
]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    common.add_common(ap)
    ap.add_argument("--sessions", type=int, default=3, help="interactive sessions")
    ap.add_argument("--turns", type=int, help="turns per session (default 3, quick 2)")
    ap.add_argument("--max-tokens", type=int, help="tokens per turn (default 48, quick 12)")
    ap.add_argument("--doc-tokens", type=int, help="document length (default 1500, quick 250)")
    ap.add_argument("--summary-tokens", type=int, help="summary length (default 128, quick 24)")
    ap.add_argument("--think-s", type=float, default=0.2, help="pause between turns (s)")
    common.add_label_background(ap, "the document")


async def interactive_sessions(
    target: Target, args: argparse.Namespace, wl: Workload, turns: int, n: int, bar, salt: int
) -> list[list[RequestResult]]:
    async def session(s: int) -> list[RequestResult]:
        out = []
        for t in range(turns):
            seed = args.seed + salt + 10 * s + t
            spec = RequestSpec(wl.chat_prompt(40), n, seed=seed, tag=f"s{s}")
            out.append(await target.generate(spec))
            bar.update(1)
            await asyncio.sleep(args.think_s)
        return out

    return list(await asyncio.gather(*(session(s) for s in range(args.sessions))))


async def measure(target: Target, args: argparse.Namespace, run: RunDir) -> dict:
    """The interactive sessions alone first (their baseline: the same sessions, same shape,
    no document), then again beside the document; ratios are loaded / alone."""
    wl = Workload(args.seed)
    turns = args.turns or (2 if args.quick else 3)
    n = args.max_tokens or (12 if args.quick else 48)
    doc = RequestSpec(
        wl.document(args.doc_tokens or (250 if args.quick else 1500)),
        args.summary_tokens or (24 if args.quick else 128),
        qos=common.bulk_label(args),
        seed=args.seed,
        tag="doc",
    )
    progress = common.bar(2 * args.sessions * turns + 1, "mixed-load")
    t0 = time.perf_counter()
    alone = await interactive_sessions(target, args, wl, turns, n, progress, 500)
    alone_dt = time.perf_counter() - t0

    async def document() -> RequestResult:
        r = await target.generate(doc)
        progress.update(1)
        return r

    t0 = time.perf_counter()
    doc_task = asyncio.create_task(document())
    sessions = await interactive_sessions(target, args, wl, turns, n, progress, 0)
    doc_res = await doc_task
    dt = time.perf_counter() - t0
    progress.close()

    _write_tokens(run, target.name, sessions, doc_res, t0)
    base = [r for rs in alone for r in rs]
    inter = [r for rs in sessions for r in rs]
    a = common.summarize(base, alone_dt).to_dict()
    i = common.summarize(inter, dt).to_dict()
    b = common.summarize([doc_res], dt).to_dict()
    return {
        "alone": a,
        "interactive": i,
        "ratio_to_alone": {key: ratio(i[key], a[key]) for key in RATIO_KEYS},
        "background": b,
        "failed": a["failed"] + i["failed"] + b["failed"],
        "errors": common.errors([*base, *inter, doc_res]),
    }


def _write_tokens(
    run: RunDir,
    server: str,
    sessions: list[list[RequestResult]],
    doc_res: RequestResult,
    t0: float,
) -> None:
    """tokens.csv (each token's time, ms after ``t0``, the loaded phase's start) and the plot
    of inter-token gaps."""
    rows, streams = [], []
    for sid, results in [*((f"s{s}", rs) for s, rs in enumerate(sessions)), ("doc", [doc_res])]:
        for r in results:
            base = (r.t_send - t0) * 1000.0
            ts = [round(base + x, 3) for x in r.token_ms]
            rows += [[sid, k, t, int(sid != "doc")] for k, t in enumerate(ts)]
            streams.append((sid, ts[1:], gaps(r.token_ms)))
    run.write_csv("tokens.csv", ["session_id", "token_idx", "ts_ms", "is_interactive"], rows)
    plot_gaps(run, "gaps.png", f"mixed-load on {server}: inter-token gaps", streams)


def run(args: argparse.Namespace) -> int:
    return common.run_scenario(args, sys.modules[__name__])
