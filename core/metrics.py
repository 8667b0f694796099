"""Engine metrics: counters, gauges and fixed-bucket histograms.

Written only by the engine thread; read by the I/O thread for the ``metrics`` request without
a lock (plain attribute reads under the GIL), so answering never blocks the engine. A snapshot
may be one tick stale, never torn inside one number.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import Any

# Upper bounds in milliseconds (+Inf implied), shaped for interactive serving.
LATENCY_BUCKETS_MS = (
    5, 10, 15, 20, 30, 40, 50, 75, 100, 150, 200, 300, 500, 750,
    1000, 1500, 2000, 3000, 5000, 10000, 20000, 60000,
)  # fmt: skip

# Upper bounds in tokens for per-request token counts (vLLM's 1-2-5 series)
TOKEN_BUCKETS = (
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000,
)  # fmt: skip

END_REASONS = ("stop", "length", "cancelled", "error")
QOS_CLASSES = ("interactive", "background")


class Histogram:
    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS_MS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "bounds": list(self.bounds),
            "counts": list(self.counts),
            "sum": self.sum,
            "count": self.count,
        }


class EngineMetrics:
    def __init__(self) -> None:
        self.started = time.time()
        self.decode_ms_last = 0.0
        self.decode_ms_ewma = 0.0
        self.tokens_per_tick_decode = 0
        self.tokens_per_tick_prefill = 0
        self.batch_size_last = 0
        self.served_decoders = 0
        self.parked_sessions = 0
        self.active_sessions = 0
        self.waiting_sessions = 0
        self.kv_cells_used = 0
        self.kv_cells_total = 0
        self.tokens_generated_total = 0
        self.prompt_tokens_total = 0
        self.batch_calls_total = 0
        self.decode_failures_total = 0
        self.requests_total = dict.fromkeys(END_REASONS, 0)
        self.prefill_guard_active = 0
        self.ticks_over_budget_total = 0
        self.ticks_aborted_total = 0
        self.ticks_paused_total = 0
        self.tick_ms_predicted_last = 0.0
        self.tick_overhead_ms_ewma = 0.0
        self.tick_budget_ms_last = 0.0
        self.bmt_estimate_last = 0.0
        self.bmt_budget = 0.0
        self.bg_decoders_cap = 0
        self.bg_burst = 1
        self.prefix_cache_queries_total = 0
        self.prefix_cache_hits_total = 0
        self.prompt_tokens_reused_total = 0  # tokens taken from a recent prompt's tokenization
        self.prefix_cache_cached_tokens_total = 0
        self.prefix_cache_resident_tokens = 0
        self.prefix_cache_entries = 0
        self.prefix_cache_evictions_total = 0
        self.spec_drafted_tokens_total = 0
        self.spec_accepted_tokens_total = 0
        self.ttft_ms = Histogram()
        self.inter_token_ms = Histogram()
        self.ttft_ms_by_qos = {q: Histogram() for q in QOS_CLASSES}
        self.inter_token_ms_by_qos = {q: Histogram() for q in QOS_CLASSES}
        self.e2e_ms = Histogram()
        self.queue_ms = Histogram()
        self.request_prompt_tokens = Histogram(TOKEN_BUCKETS)  # per finished request
        self.request_generation_tokens = Histogram(TOKEN_BUCKETS)

    def record_tick(self, ms: float, n_decode: int, n_prefill: int, alpha: float = 0.2) -> None:
        self.decode_ms_last = ms
        self.decode_ms_ewma = (
            ms if self.batch_calls_total == 0 else (alpha * ms + (1 - alpha) * self.decode_ms_ewma)
        )
        self.tokens_per_tick_decode = n_decode
        self.tokens_per_tick_prefill = n_prefill
        self.batch_size_last = n_decode + n_prefill
        self.served_decoders = n_decode
        self.prompt_tokens_total += n_prefill
        self.batch_calls_total += 1

    def observe_ttft(self, qos: str, ms: float) -> None:
        self.ttft_ms.observe(ms)
        self.ttft_ms_by_qos[qos].observe(ms)

    def observe_itl(self, qos: str, ms: float) -> None:
        self.inter_token_ms.observe(ms)
        self.inter_token_ms_by_qos[qos].observe(ms)

    def snapshot(self) -> dict[str, Any]:
        total = self.kv_cells_total
        return {
            "uptime_s": time.time() - self.started,
            "decode_ms_last": self.decode_ms_last,
            "decode_ms_ewma": self.decode_ms_ewma,
            "tokens_per_tick": {
                "decode": self.tokens_per_tick_decode,
                "prefill": self.tokens_per_tick_prefill,
            },
            "batch_size_last": self.batch_size_last,
            "served_decoders": self.served_decoders,
            "parked_sessions": self.parked_sessions,
            "active_sessions": self.active_sessions,
            "waiting_sessions": self.waiting_sessions,
            "kv_cells_used": self.kv_cells_used,
            "kv_cells_total": total,
            "kv_cache_usage_ratio": self.kv_cells_used / total if total else 0.0,
            "tokens_generated_total": self.tokens_generated_total,
            "prompt_tokens_total": self.prompt_tokens_total,
            "batch_calls_total": self.batch_calls_total,
            "decode_failures_total": self.decode_failures_total,
            "requests_total": dict(self.requests_total),
            "prefill_guard_active": self.prefill_guard_active,
            "ticks_over_budget_total": self.ticks_over_budget_total,
            "ticks_aborted_total": self.ticks_aborted_total,
            "ticks_paused_total": self.ticks_paused_total,
            "tick_ms_predicted_last": self.tick_ms_predicted_last,
            "tick_overhead_ms_ewma": self.tick_overhead_ms_ewma,
            "tick_budget_ms_last": self.tick_budget_ms_last,
            "bmt_estimate_last": self.bmt_estimate_last,
            "bmt_budget": self.bmt_budget,
            "tuner": {"bg_decoders_cap": self.bg_decoders_cap, "bg_burst": self.bg_burst},
            "prefix_cache_queries_total": self.prefix_cache_queries_total,
            "prefix_cache_hits_total": self.prefix_cache_hits_total,
            "prompt_tokens_reused_total": self.prompt_tokens_reused_total,
            "prefix_cache_cached_tokens_total": self.prefix_cache_cached_tokens_total,
            "prefix_cache_resident_tokens": self.prefix_cache_resident_tokens,
            "prefix_cache_entries": self.prefix_cache_entries,
            "prefix_cache_evictions_total": self.prefix_cache_evictions_total,
            "spec_drafted_tokens_total": self.spec_drafted_tokens_total,
            "spec_accepted_tokens_total": self.spec_accepted_tokens_total,
            "spec_acceptance_rate": self.spec_accepted_tokens_total / self.spec_drafted_tokens_total
            if self.spec_drafted_tokens_total
            else 0.0,
            "histograms": {
                "ttft_ms": self.ttft_ms.snapshot(),
                "inter_token_ms": self.inter_token_ms.snapshot(),
                "e2e_ms": self.e2e_ms.snapshot(),
                "queue_ms": self.queue_ms.snapshot(),
            },
            "token_histograms": {
                "request_prompt_tokens": self.request_prompt_tokens.snapshot(),
                "request_generation_tokens": self.request_generation_tokens.snapshot(),
            },
            "histograms_by_qos": {
                "ttft_ms": {q: h.snapshot() for q, h in self.ttft_ms_by_qos.items()},
                "inter_token_ms": {q: h.snapshot() for q, h in self.inter_token_ms_by_qos.items()},
            },
        }
