"""Engine metrics: counters, gauges and fixed-bucket histograms.

What they mean, how they are exported and where they start is declared once:
protocol.MetricsSnapshot (core/metrics_schema.py); EngineMetrics starts from its defaults.
Written only by the engine thread; read by the I/O thread for the ``metrics`` request without
a lock (plain attribute reads under the GIL), so answering never blocks the engine. A snapshot
may be one tick stale, never torn inside one number.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import Any

import msgspec

from uma_serve.core import protocol as p

# Upper bounds in milliseconds (+Inf implied), shaped for interactive serving.
LATENCY_BUCKETS_MS = (
    5, 10, 15, 20, 30, 40, 50, 75, 100, 150, 200, 300, 500, 750,
    1000, 1500, 2000, 3000, 5000, 10000, 20000, 60000,
)  # fmt: skip

# Upper bounds in tokens for the tokens of one request (vLLM's 1-2-5 series, +Inf implied).
TOKEN_BUCKETS = (
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000,
)  # fmt: skip

# Upper bounds in milliseconds for the parts of one tick (a GPU's tick is ~1.5 ms, its
# sampling a fraction of that; a CPU's tens of ms)
TICK_BUCKETS_MS = (
    0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 75, 100, 150, 250, 500,
    1000, 2500,
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

    def snapshot(self) -> p.Histogram:
        return p.Histogram(list(self.bounds), list(self.counts), self.sum, self.count)


class StateGauges:
    """Gauges of what one part of the engine holds (a scheduler: its sequences; a prefix
    store: its entries), written by the engine thread; the exported gauge is their sum over
    every part, so several contexts' schedulers each write their own."""

    __slots__ = (
        "active_sessions",
        "waiting_sessions",
        "kv_cells_used",
        "prefix_cache_resident_tokens",
        "prefix_cache_entries",
    )

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)


class EngineMetrics:
    def __init__(self) -> None:
        self.started = time.time()
        defaults = p.MetricsSnapshot()  # each counter and gauge as the schema declares it
        for name in PLAIN:
            if name not in StateGauges.__slots__:
                setattr(self, name, getattr(defaults, name))
        self._parts: list[StateGauges] = []
        self.tokens_per_tick_decode = self.tokens_per_tick_prefill = 0
        self.requests_total = dict.fromkeys(END_REASONS, 0)
        self.bg_decoders_cap = 0
        self.bg_burst = 1
        self.ttft_ms = Histogram()
        self.inter_token_ms = Histogram()
        self.ttft_ms_by_qos = {q: Histogram() for q in QOS_CLASSES}
        self.inter_token_ms_by_qos = {q: Histogram() for q in QOS_CLASSES}
        self.e2e_ms = Histogram()
        self.queue_ms = Histogram()
        self.request_prompt_tokens = Histogram(TOKEN_BUCKETS)
        self.request_generation_tokens = Histogram(TOKEN_BUCKETS)
        self.prefill_ms = Histogram()
        self.decode_ms = Histogram()
        parts = [Histogram(TICK_BUCKETS_MS) for _ in range(3)]  # a tick's
        self.tick_decode_ms, self.tick_sample_ms, self.tick_overlap_ms = parts
        self.request_max_tokens = Histogram(TOKEN_BUCKETS)

    def state(self) -> StateGauges:
        """A part's own state gauges, summed into the exported ones."""
        part = StateGauges()
        self._parts.append(part)
        return part

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

    def observe_tick_parts(self, decode_ms: float, sample_ms: float, overlap_ms: float) -> None:
        """A tick's decode (launch to device done), its sampling, and the host work done
        between launch and collection."""
        self.tick_decode_ms.observe(decode_ms)
        self.tick_sample_ms.observe(sample_ms)
        self.tick_overlap_ms.observe(overlap_ms)

    def observe_ttft(self, qos: str, ms: float) -> None:
        self.ttft_ms.observe(ms)
        self.ttft_ms_by_qos[qos].observe(ms)

    def observe_itl(self, qos: str, ms: float) -> None:
        self.inter_token_ms.observe(ms)
        self.inter_token_ms_by_qos[qos].observe(ms)

    def observe_request(self, prompt_tokens: int, generated: int, max_tokens: int) -> None:
        """A finished request's size: its prompt, what it generated, what it could have."""
        self.request_prompt_tokens.observe(prompt_tokens)
        self.request_generation_tokens.observe(generated)
        self.request_max_tokens.observe(max_tokens)

    def observe_phases(self, admitted_ns: int | None, first_ns: int | None, end_ns: int) -> None:
        """A finished request's prefill (admission to first token) and decode (first token
        to end) times, as vLLM's request_prefill/decode_time; none without a first token."""
        if admitted_ns is not None and first_ns is not None:
            self.prefill_ms.observe((first_ns - admitted_ns) * 1e-6)
            self.decode_ms.observe((end_ns - first_ns) * 1e-6)

    def snapshot(self, prompt_tokens_reused_total: int = 0) -> dict[str, Any]:
        """The ``metrics`` answer: protocol.MetricsSnapshot as a JSON-ready dict. Its plain
        fields are read from the attributes of the same name; the tokenizer's reuse count is
        the I/O thread's (it tokenizes)."""
        plain = {name: getattr(self, name) for name in PLAIN}
        total, drafted = self.kv_cells_total, self.spec_drafted_tokens_total
        snap = p.MetricsSnapshot(
            **plain,
            uptime_s=time.time() - self.started,
            kv_cache_usage_ratio=self.kv_cells_used / total if total else 0.0,
            spec_acceptance_rate=self.spec_accepted_tokens_total / drafted if drafted else 0.0,
            prompt_tokens_reused_total=prompt_tokens_reused_total,
            tokens_per_tick=p.TickTokens(self.tokens_per_tick_decode, self.tokens_per_tick_prefill),
            requests_total=p.RequestsByReason(**self.requests_total),
            tuner=p.TunerState(self.bg_decoders_cap, self.bg_burst),
            histograms=p.Histograms(
                self.ttft_ms.snapshot(),
                self.inter_token_ms.snapshot(),
                self.e2e_ms.snapshot(),
                self.queue_ms.snapshot(),
                self.prefill_ms.snapshot(),
                self.decode_ms.snapshot(),
                self.tick_decode_ms.snapshot(),
                self.tick_sample_ms.snapshot(),
                self.tick_overlap_ms.snapshot(),
            ),
            token_histograms=p.TokenHistograms(
                self.request_prompt_tokens.snapshot(),
                self.request_generation_tokens.snapshot(),
                self.request_max_tokens.snapshot(),
            ),
            histograms_by_qos=p.QosHistograms(
                {q: h.snapshot() for q, h in self.ttft_ms_by_qos.items()},
                {q: h.snapshot() for q, h in self.inter_token_ms_by_qos.items()},
            ),
        )
        return msgspec.to_builtins(snap)


def _summed(name: str) -> property:
    return property(lambda self: sum(getattr(part, name) for part in self._parts))


for _name in StateGauges.__slots__:
    setattr(EngineMetrics, _name, _summed(_name))

# snapshot fields computed or composed by EngineMetrics.snapshot (the rest are attributes)
COMPOSED = frozenset(
    {"uptime_s", "kv_cache_usage_ratio", "spec_acceptance_rate", "prompt_tokens_reused_total",
     "tokens_per_tick", "requests_total", "tuner", "histograms", "token_histograms",
     "histograms_by_qos"}
)  # fmt: skip
# the rest: attributes of the same names, written where they change (a new counter or gauge
# is its declaration in core/metrics_schema.py and the line that updates it)
PLAIN = tuple(n for n in p.MetricsSnapshot.__struct_fields__ if n not in COMPOSED)


def metrics_table() -> str:
    """docs/METRICS.md's table of the snapshot, from protocol.MetricsSnapshot (a test keeps
    the two identical)."""
    rows = ["| field | type | meaning |", "|---|---|---|"]
    for path, t, meta in p.metric_fields():
        rows.append(f"| `{path}` | {_type_text(path, t, meta)} | {meta.description} |")
    return "\n".join(rows)


def _type_text(path: str, t: Any, meta: msgspec.Meta) -> str:
    if t is p.Histogram:
        return "histogram"
    if t is int and p.prom_kind(path, meta) == "counter":
        return "counter"
    if isinstance(t, type) and issubclass(t, msgspec.Struct):
        return "`{" + ", ".join(t.__struct_fields__) + "}`"
    if str(t).startswith("dict"):
        return "`{" + ", ".join(QOS_CLASSES) + "}` x histogram"
    return getattr(t, "__name__", str(t))
