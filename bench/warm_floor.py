"""warm-floor: the least a cached prefix costs a question, by arithmetic and by llama_decode.

A question after a cached system prompt prefills only its own tokens, but each of them attends
to the cached positions (all of them in a global layer, the last n_swa in a sliding-window
one): work that the question alone does not do. This scenario counts that work in
multiply-adds next to the question's own (its matmuls and its one row of logits), and times
both prefills in-process with the daemon's cache layout (swa_full, shadow ids, the prefix
copied by seq_cp), with no daemon, socket or sampling. `shared-prefix`'s warm / alone ratio
reads against these two: the first is the model's floor, the second llama.cpp's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from uma_serve.bench import common
from uma_serve.bench.shared_prefix import question, system_prompt
from uma_serve.bench.workloads import Workload

if TYPE_CHECKING:  # the runtime package loads llama.cpp: imported where it runs only
    from uma_serve.core.runtime import Runtime
    from uma_serve.core.runtime.params import ModelShape


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--system-tokens", type=int, default=1500, help="cached prefix (approx.)")
    ap.add_argument("--rounds", type=int, default=7, help="alone / warm pairs (medians)")
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=1234)
    common.add_in_process(ap)


def macs(shape: ModelShape, cached: int, n_question: int) -> tuple[int, int]:
    """(multiply-adds of the question alone, those its tokens add after ``cached`` positions).

    Alone: every token through the weights (the embedding table is a lookup), attention over
    its own earlier tokens, one row of logits (the LM head, tied to the embedding here)."""
    per_pos = shape.n_head * (shape.head_k + shape.head_v)  # one query, one position, one layer
    n_global = shape.n_layer - shape.swa_layers
    weights = shape.n_params - shape.n_vocab * shape.n_embd
    own = sum(j + 1 for j in range(n_question)) * per_pos * shape.n_layer
    alone = n_question * weights + own + shape.n_vocab * shape.n_embd
    extra = 0
    for j in range(n_question):
        in_window = min(cached, max(0, shape.n_swa - 1 - j)) if shape.swa_layers else 0
        extra += per_pos * (n_global * cached + shape.swa_layers * in_window)
    return alone, extra


def run(args: argparse.Namespace) -> int:
    from uma_serve.core.config import default_model_path

    model = args.model or default_model_path()
    rt = _open_runtime(args, model)
    wl = Workload(args.seed)
    prefix = rt.tokenize(system_prompt(wl, args.system_tokens))
    texts = [question(wl, i) for i in range(args.rounds + 1)]
    questions = [rt.tokenize(t, add_special=False) for t in texts]
    times = _time_rounds(rt, prefix, texts, questions)
    shape = rt.info.shape()
    rt.close()
    n_q = round(statistics.mean(len(q) for q in questions))
    summary = _summary(args, model, shape, len(prefix), n_q, times)
    out = Path(args.out) / time.strftime("warm-floor-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    _print_summary(summary, out)
    return 0


def _open_runtime(args: argparse.Namespace, model: str) -> Runtime:
    """The daemon's cache layout: its sequences and prefix-cache ids."""
    from uma_serve.core.config import Config, prefix_cache_size
    from uma_serve.core.runtime import Runtime, RuntimeParams

    defaults = Config()
    return Runtime(
        RuntimeParams(
            model,
            n_ctx=args.n_ctx,
            n_seq=defaults.n_seq,
            n_seq_cache=prefix_cache_size(defaults)[1],
            swa_full=True,
            shadow=True,
            threads=args.threads,
            n_gpu_layers=args.n_gpu_layers,
        )
    )


def _timed(rt: Runtime, spans: list) -> float:
    """One llama_decode of ``spans``, synchronized: milliseconds."""
    t0 = time.perf_counter()
    rc, _ = rt.decode(spans)
    rt.synchronize()
    assert rc == 0, rc
    return (time.perf_counter() - t0) * 1e3


def _alone(rt: Runtime, seq_id: int, text: str) -> float:
    """A question's prefill on its own, from position 0 (with BOS)."""
    from uma_serve.core.runtime import Span

    rt.seq_clear(seq_id)
    return _timed(rt, [Span(seq_id, 0, rt.tokenize(text), True)])


def _load_prefix(rt: Runtime, cache_id: int, prefix: list[int]) -> None:
    from uma_serve.core.runtime import Span

    for start in range(0, len(prefix), rt.n_batch):
        rc, _ = rt.decode([Span(cache_id, start, prefix[start : start + rt.n_batch], False)])
        assert rc == 0, rc


def _time_rounds(
    rt: Runtime, prefix: list[int], texts: list[str], questions: list[list[int]]
) -> tuple[list[float], list[float], list[float]]:
    """Per round after the first, in ms: the question alone in an empty cache, alone beside
    the resident prefix, and warm after it."""
    from uma_serve.core.runtime import Span

    cache_id, alone_id, warm_id = rt.params.n_seq, 1, 2  # the cache's first id holds the prefix
    # each round, side by side (the machine's speed drifts): the question alone in an empty
    # cache (as shared-prefix's first phase finds it), alone beside the resident prefix (its
    # cells in the attended range, masked), and warm after it; the first round warms up
    empty, beside, warm = [], [], []
    for i, q in enumerate(questions):
        for seq_id in (cache_id, alone_id, warm_id):
            rt.seq_clear(seq_id)
        e = _alone(rt, alone_id, texts[i])
        _load_prefix(rt, cache_id, prefix)
        a = _alone(rt, alone_id, texts[i])
        rt.seq_copy(cache_id, warm_id, len(prefix))
        w = _timed(rt, [Span(warm_id, len(prefix), q, True)])
        if i:
            empty.append(e)
            beside.append(a)
            warm.append(w)
    return empty, beside, warm


def _summary(
    args: argparse.Namespace,
    model: str,
    shape: ModelShape,
    cached: int,
    n_q: int,
    times: tuple[list[float], list[float], list[float]],
) -> dict:
    """summary.json: the arithmetic floor next to the timed prefills and their medians."""
    empty, beside, warm = times
    m_alone, m_extra = macs(shape, cached, n_q)
    a, b, w = (statistics.median(x) for x in (empty, beside, warm))
    return {
        "scenario": "warm-floor",
        "model": Path(model).name,
        "n_gpu_layers": args.n_gpu_layers,
        "cached_tokens": cached,
        "question_tokens": n_q,
        "shape": asdict(shape),
        "macs_alone": m_alone,
        "macs_extra": m_extra,
        "floor_arithmetic": (m_alone + m_extra) / m_alone,
        "decode_alone_ms": empty,
        "decode_alone_beside_prefix_ms": beside,
        "decode_warm_ms": warm,
        "decode_alone_p50_ms": a,
        "decode_alone_beside_prefix_p50_ms": b,
        "decode_warm_p50_ms": w,
        "warm_over_alone_decode": w / a,
        "warm_over_alone_beside_prefix": w / b,
    }


def _print_summary(s: dict, out: Path) -> None:
    m_alone, m_extra = s["macs_alone"], s["macs_extra"]
    a, b = s["decode_alone_p50_ms"], s["decode_alone_beside_prefix_p50_ms"]
    w = s["decode_warm_p50_ms"]
    print(
        f"warm-floor: {s['cached_tokens']} cached tokens, {s['question_tokens']}-token question\n"
        f"  arithmetic: alone {m_alone / 1e6:,.0f}M multiply-adds, the cached positions add "
        f"{m_extra / 1e6:,.0f}M: warm / alone >= {s['floor_arithmetic']:.3f}\n"
        f"  llama_decode (medians of {len(s['decode_warm_ms'])}): alone {a:.2f} ms (empty cache), "
        f"{b:.2f} ms (beside the prefix), warm {w:.2f} ms: warm / alone "
        f"{w / a:.3f} ({w / b:.3f})\n"
        f"summary: {out / 'summary.json'}"
    )
