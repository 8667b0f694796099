"""calibrate: measure this machine's effective bandwidth for the loaded model (--bmt-budget).

Runs decode-only ticks at several batch sizes and context lengths in-process, estimates the
bytes each tick moves with the guard's own model (core/policy/bmt.py: weights once + KV cells
attended x bytes per cell) and divides by the measured decode time. Prints the GB/s to pass
as ``umad --bmt-budget`` (or UMA_BMT_BUDGET).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from uma_serve.bench import common
from uma_serve.core.policy import BatchItem, ModelFacts, Phase, SessionView
from uma_serve.core.policy.bmt import tick_bytes

if TYPE_CHECKING:  # the runtime package loads llama.cpp: imported where it runs only
    from uma_serve.core.runtime import Runtime


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--n-seq", type=int, default=4)
    ap.add_argument("--contexts", default="64,512,1536", help="KV lengths to decode at")
    ap.add_argument("--ticks", type=int, default=12, help="decode ticks per point")
    common.add_in_process(ap)


def run(args: argparse.Namespace) -> int:
    from uma_serve.core.config import default_model_path
    from uma_serve.core.runtime import Runtime, RuntimeParams

    contexts = [int(x) for x in args.contexts.split(",")]
    n_ctx = args.n_seq * (max(contexts) + args.ticks + 16)
    rt = Runtime(
        RuntimeParams(
            args.model or default_model_path(),
            n_ctx=n_ctx,
            n_seq=args.n_seq,
            threads=args.threads,
            n_gpu_layers=args.n_gpu_layers,
        )
    )
    facts = rt.info.facts()
    filler = rt.tokenize("the quick brown fox jumps over the lazy dog " * 400, add_special=False)
    rows = []
    for ctx in contexts:
        _fill(rt, args.n_seq, ctx, filler)
        for n in range(1, args.n_seq + 1):
            rows.append(_point(rt, facts, filler, ctx, n, args.ticks))
    rt.close()
    gbs = statistics.median(r["gbs"] for r in rows)
    out = Path(args.out) / time.strftime("calibrate-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    summary = {"effective_gbs": gbs, "points": rows, "model_facts": msgspec.structs.asdict(facts)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"effective bandwidth {gbs:.2f} GB/s: run umad --bmt-budget {gbs:.2f}")
    print(f"summary: {out / 'summary.json'}")
    return 0


def _fill(rt: Runtime, n_seq: int, ctx: int, filler: list[int]) -> None:
    """Fill every sequence to ``ctx`` positions, in n_batch chunks."""
    from uma_serve.core.runtime import Span

    for seq in range(n_seq):
        rt.seq_clear(seq)
        for start in range(0, ctx, rt.n_batch):
            chunk = filler[start : min(ctx, start + rt.n_batch)]
            assert rt.decode([Span(seq, start, chunk, False)])[0] == 0


def _point(rt: Runtime, facts: ModelFacts, filler: list[int], ctx: int, n: int, ticks: int) -> dict:
    """``ticks`` decode ticks of ``n`` sequences at ``ctx``: the median time, the bytes the
    guard's model estimates, and their quotient (printed too); the sequences are trimmed back
    to ``ctx`` after."""
    from uma_serve.core.runtime import Span

    views = {s: SessionView(s, Phase.DECODE, "background", ctx, ctx, 0, 0, 0) for s in range(n)}
    items = tuple(BatchItem(s, Phase.DECODE, 1, True) for s in range(n))
    est = tick_bytes(items, views, facts)
    times = []
    for t in range(ticks):
        spans = [Span(s, ctx + t, [filler[t]], True) for s in range(n)]
        t0 = time.perf_counter()
        assert rt.decode(spans)[0] == 0
        times.append(time.perf_counter() - t0)
    for s in range(n):
        rt.seq_trim(s, ctx)
    ms = statistics.median(times) * 1e3
    print(f"ctx {ctx:5d} decoders {n}: {ms:6.1f} ms, {est / 1e6:7.1f} MB -> "
          f"{est / ms / 1e6:5.2f} GB/s")  # fmt: skip
    return {"ctx": ctx, "decoders": n, "ms": ms, "bytes": est, "gbs": est / ms / 1e6}
