"""shared-prefix: N sessions share one long system prompt (~1,500 tokens) with unique questions.

TTFT of the question alone (no system prompt) is the reference; then one cold request with the
system prompt, then N warm requests sequentially and N with 4 in flight. With the prefix cache
the warm requests only prefill their question: the targets are warm TTFT <= 1.2x the question
alone, sequentially and concurrently (compared with the question alone at the same concurrency),
and the slowest of the concurrent warm requests within ``concurrency`` times a warm one alone
(their questions are that many times the prefill work: none waits for another's answer).
"""

from __future__ import annotations

import argparse
import statistics

from uma_serve.bench import common
from uma_serve.bench.report import RunDir
from uma_serve.bench.targets import RequestResult, RequestSpec, Target
from uma_serve.bench.workloads import Workload

NAME = "shared-prefix"
KEY_METRICS = [
    ("ttft_cold_ms", "lower"),
    ("ttft_alone_seq_p50_ms", "lower"),
    ("ttft_warm_seq_p50_ms", "lower"),
    ("warm_over_alone_seq", "lower"),
    ("ttft_alone_conc_p50_ms", "lower"),
    ("ttft_warm_conc_p50_ms", "lower"),
    ("warm_over_alone_conc", "lower"),
    ("warm_conc_max_over_warm_seq", "lower"),
]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    common.add_common(ap)
    ap.add_argument("--sessions", type=int, help="sessions per phase (default 8, quick 4)")
    ap.add_argument("--system-tokens", type=int, help="system prompt (default 1500, quick 600)")
    ap.add_argument("--concurrency", type=int, default=4, help="in flight in the concurrent phase")
    ap.add_argument("--max-tokens", type=int, default=8, help="tokens per answer (default 8)")


def system_prompt(wl: Workload, n_tokens: int) -> str:
    return (
        f"System {wl.seed}. You are the assistant of a travel agency. Follow these notes.\n"
        f"{wl.words(int(n_tokens * 1.2) - 20)}\n\n"
    )


def question(wl: Workload, i: int) -> str:
    return f"Question {wl.seed}-{i}: {wl.words(24)}?\nAnswer:"


def _ttfts(results: list[RequestResult]) -> list[float]:
    return [r.token_ms[0] for r in results if r.ok and r.token_ms]


def _server(results: list[RequestResult], field: str) -> list[float]:
    values = (getattr(r, field) for r in results if r.ok)
    return [v for v in values if v is not None]


def _p50(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


async def measure(target: Target, args: argparse.Namespace, run: RunDir) -> dict:
    wl = Workload(args.seed)
    n = args.sessions or (4 if args.quick else 8)
    sys_tokens = args.system_tokens or (600 if args.quick else 1500)
    system = system_prompt(wl, sys_tokens)
    phases = await _run_phases(target, args, wl, system, n)
    from uma_serve.bench.repetitive import core_metrics

    m = await core_metrics(target) or {}
    out: dict = {"sessions": n, "concurrency": args.concurrency, **_cache_figures(m)}
    rows = _phase_figures(out, phases)
    out["ttft_cold_ms"] = out.pop("ttft_cold_p50_ms")
    out["system_prompt_tokens"] = (phases["cold"][0].prompt_tokens or 0) - (
        phases["alone_seq"][0].prompt_tokens or 0
    )
    for mode in ("seq", "conc"):
        warm, alone = out[f"ttft_warm_{mode}_p50_ms"], out[f"ttft_alone_{mode}_p50_ms"]
        out[f"warm_over_alone_{mode}"] = warm / alone if warm and alone else None
    # sharers served together: the slowest concurrent warm request over a warm one alone
    slowest, single = max(_ttfts(phases["warm_conc"]), default=None), out["ttft_warm_seq_p50_ms"]
    out["ttft_warm_conc_max_ms"] = slowest
    out["warm_conc_max_over_warm_seq"] = slowest / single if slowest and single else None
    run.write_csv("ttft.csv", ["phase", "request", "prompt_tokens", "ttft_ms"], rows)
    everything = [r for results in phases.values() for r in results]
    out["failed"] = sum(1 for r in everything if not r.ok)
    out["errors"] = common.errors(everything)
    return out


async def _run_phases(
    target: Target, args: argparse.Namespace, wl: Workload, system: str, n: int
) -> dict[str, list[RequestResult]]:
    """The phases in order: the questions alone (sequential, concurrent), one cold request
    with the system prompt, then warm ones (sequential, concurrent); n requests each."""

    def spec(prompt: str, tag: str) -> RequestSpec:
        return RequestSpec(prompt, args.max_tokens, temperature=0.0, tag=tag)

    conc = args.concurrency
    phases: dict[str, list[RequestResult]] = {}
    qs = [question(wl, i) for i in range(4 * n + 1)]
    phases["alone_seq"], _ = await common.run_concurrent(
        target, [spec(q, "alone") for q in qs[:n]], 1, "alone, sequential"
    )
    phases["alone_conc"], _ = await common.run_concurrent(
        target, [spec(q, "alone") for q in qs[n : 2 * n]], conc, "alone, concurrent"
    )
    phases["cold"], _ = await common.run_concurrent(
        target, [spec(system + qs[2 * n], "cold")], 1, "cold"
    )
    phases["warm_seq"], _ = await common.run_concurrent(
        target, [spec(system + q, "warm") for q in qs[2 * n + 1 : 3 * n + 1]], 1, "warm, sequential"
    )
    phases["warm_conc"], _ = await common.run_concurrent(
        target, [spec(system + q, "warm") for q in qs[3 * n + 1 :]], conc, "warm, concurrent"
    )
    return phases


def _cache_figures(m: dict) -> dict:
    """The core's prefix-cache counters, from its metrics snapshot."""
    out: dict = {}
    for key in ("queries", "hits", "cached_tokens"):
        out[f"prefix_cache_{key}"] = m.get(f"prefix_cache_{key}_total")
    out["prefix_cache_resident_tokens"] = m.get("prefix_cache_resident_tokens")
    out["prompt_tokens_reused"] = m.get("prompt_tokens_reused_total")  # not tokenized again
    return out


def _phase_figures(out: dict, phases: dict[str, list[RequestResult]]) -> list[list]:
    """Each phase's p50s into ``out``; the rows of ttft.csv."""
    rows = []
    for name, results in phases.items():
        t = _ttfts(results)
        out[f"ttft_{name}_p50_ms"] = _p50(t)
        # where the time goes (UMA's socket only): the daemon's arrival -> admission (tokenizing
        # included) and arrival -> first token; the rest of the TTFT is the socket both ways
        out[f"server_queue_{name}_p50_ms"] = _p50(_server(results, "server_queue_ms"))
        out[f"server_ttft_{name}_p50_ms"] = _p50(_server(results, "server_ttft_ms"))
        rows += [[name, i, r.prompt_tokens, r.token_ms[0] if r.token_ms else None]
                 for i, r in enumerate(results)]  # fmt: skip
    return rows


def run(args: argparse.Namespace) -> int:
    import sys

    return common.run_scenario(args, sys.modules[__name__])
