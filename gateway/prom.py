"""Prometheus export: the core's figures from its snapshot at scrape time, plus HTTP metrics.

The core keeps the only bookkeeping of tokens, latencies and queue state; ``CoreCollector``
turns one ``metrics`` snapshot into metric families on each scrape (milliseconds become
seconds, per-bucket counts become cumulative ``le`` buckets). The gateway itself only counts
its own HTTP traffic. Names follow vLLM's with the ``uma_`` prefix (docs/METRICS.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The *_created series only add noise for a long-running gateway's counters.
disable_created_metrics()

# snapshot histogram key -> (metric name, help)
HISTOGRAMS = {
    "ttft_ms": ("uma_time_to_first_token_seconds", "Time from arrival to the first token."),
    "inter_token_ms": ("uma_inter_token_latency_seconds", "Time between consecutive tokens."),
    "e2e_ms": ("uma_e2e_request_latency_seconds", "Time from arrival to the end of a request."),
    "queue_ms": ("uma_request_queue_time_seconds", "Time a request waited before its prefill."),
}
# snapshot key -> (gauge name, help)
GAUGES = {
    "active_sessions": ("uma_num_requests_running", "Requests holding a sequence in the core."),
    "waiting_sessions": ("uma_num_requests_waiting", "Requests queued for a sequence."),
    "parked_sessions": ("uma_num_requests_parked", "Decoders the policy skipped last tick."),
    "served_decoders": ("uma_served_decoders", "Sequences decoded in the last tick."),
    "prefill_guard_active": (
        "uma_prefill_guard_active",
        "1 when a guard held back work in the last tick (or hysteresis holds prefill).",
    ),
    "bmt_estimate_last": ("uma_bmt_estimate_bytes", "Estimated bytes the last tick moved."),
    "bmt_budget": ("uma_bmt_budget_bytes_per_second", "ΣBMT guard budget (0: off)."),
    "batch_size_last": ("uma_batch_size_last", "Tokens in the last tick's batch."),
    "kv_cache_usage_ratio": ("uma_kv_cache_usage_ratio", "Used share of the KV cache (0-1)."),
    "kv_cells_used": ("uma_kv_cells_used", "KV cache cells in use."),
    "kv_cells_total": ("uma_kv_cells_capacity", "KV cache cells in total."),
    "uptime_s": ("uma_core_uptime_seconds", "Seconds since the core started."),
    "prefix_cache_resident_tokens": (
        "uma_prefix_cache_resident_tokens",
        "KV cells held by the prefix cache (cells shared between entries counted once).",
    ),
    "prefix_cache_entries": ("uma_prefix_cache_entries", "Cached prefixes resident."),
    "spec_acceptance_rate": (
        "uma_spec_acceptance_rate",
        "Accepted / drafted tokens of speculative decoding since start.",
    ),
}
# snapshot key (milliseconds) -> (gauge name in seconds, help)
MS_GAUGES = {
    "decode_ms_ewma": ("uma_decode_ewma_seconds", "EWMA of llama_decode time per tick."),
    "decode_ms_last": ("uma_decode_last_seconds", "llama_decode time of the last tick."),
    "tick_ms_predicted_last": (
        "uma_tick_predicted_seconds",
        "The tick-time model's prediction for the last tick.",
    ),
    "tick_budget_ms_last": ("uma_tick_budget_seconds", "The time budget of the last tick."),
    "tick_overhead_ms_ewma": (
        "uma_tick_overhead_ewma_seconds",
        "Engine time per tick outside llama_decode, smoothed.",
    ),
}
# snapshot key -> (counter name, help)
COUNTERS = {
    "prompt_tokens_total": ("uma_prompt_tokens_total", "Prompt tokens prefilled."),
    "tokens_generated_total": ("uma_generation_tokens_total", "Tokens generated."),
    "batch_calls_total": ("uma_batch_calls_total", "llama_decode calls (ticks)."),
    "decode_failures_total": ("uma_decode_failures_total", "llama_decode calls that failed."),
    "ticks_over_budget_total": (
        "uma_ticks_over_budget_total",
        "Ticks whose decode time passed the budget the guard planned for.",
    ),
    "ticks_aborted_total": (
        "uma_ticks_aborted_total",
        "Background ticks stopped mid-decode because an interactive request arrived.",
    ),
    "ticks_paused_total": (
        "uma_ticks_paused_total",
        "Whole-batch background ticks among interactive ones (stepped tick cost: a GPU).",
    ),
    "prefix_cache_queries_total": (
        "uma_prefix_cache_queries_total",
        "Admitted requests looked up in the prefix cache.",
    ),
    "prefix_cache_hits_total": (
        "uma_prefix_cache_hits_total",
        "Admitted requests that reused a cached prefix.",
    ),
    "prefix_cache_cached_tokens_total": (
        "uma_prefix_cache_cached_tokens_total",
        "Prompt tokens whose KV came from the prefix cache instead of prefill.",
    ),
    "prompt_tokens_reused_total": (
        "uma_prompt_tokens_reused_total",
        "Prompt tokens taken from a recent prompt's tokenization (not tokenized again).",
    ),
    "prefix_cache_evictions_total": (
        "uma_prefix_cache_evictions_total",
        "Times the whole prefix cache was dropped because running sequences needed the KV.",
    ),
    "spec_drafted_tokens_total": (
        "uma_spec_drafted_tokens_total",
        "Prompt-lookup draft tokens verified by speculative decoding.",
    ),
    "spec_accepted_tokens_total": (
        "uma_spec_accepted_tokens_total",
        "Draft tokens accepted (identical to what the model sampled).",
    ),
}


# vLLM's names where ours differ: the same figures exported under both
ALIAS_GAUGES = {
    "kv_cache_usage_ratio": ("uma_kv_cache_usage_perc", "KV cache usage (0-1), vLLM's name."),
}
ALIAS_HISTOGRAMS = {
    "inter_token_ms": (
        "uma_time_per_output_token_seconds",
        "Time between consecutive tokens (vLLM's time per output token).",
    ),
}
# snapshot token_histograms key -> (metric name, help): counts of tokens, not times
TOKEN_HISTOGRAMS = {
    "request_prompt_tokens": ("uma_request_prompt_tokens", "Prompt tokens per finished request."),
    "request_generation_tokens": (
        "uma_request_generation_tokens",
        "Generated tokens per finished request.",
    ),
}

# our families that vLLM also exports, under the same name after its prefix: with
# --vllm-metric-names they are exported a second time as ``vllm:<name>``
VLLM_NAMES = frozenset({
    "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
    "time_to_first_token_seconds", "time_per_output_token_seconds",
    "inter_token_latency_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
    "request_prompt_tokens", "request_generation_tokens", "prompt_tokens", "generation_tokens",
    "request_success",
})  # fmt: skip

QOS_HISTOGRAMS = {
    "ttft_ms": ("uma_qos_time_to_first_token_seconds", "Time to the first token, by QoS class."),
    "inter_token_ms": ("uma_qos_inter_token_latency_seconds", "Inter-token gaps, by QoS class."),
}


def cumulative_buckets(h: dict[str, Any], scale: float = 1e-3) -> list[tuple[str, float]]:
    """Core histogram (per-bucket counts) -> cumulative ``le`` buckets, bounds times
    ``scale`` (milliseconds to seconds by default)."""
    buckets: list[tuple[str, float]] = []
    running = 0
    counts = h.get("counts", [])
    for bound, n in zip(h.get("bounds", []), counts, strict=False):
        running += n
        buckets.append((repr(bound * scale if scale != 1.0 else float(bound)), running))
    buckets.append(("+Inf", h.get("count", sum(counts))))
    return buckets


def histogram_family(name: str, doc: str, h: dict[str, Any]) -> HistogramMetricFamily:
    return HistogramMetricFamily(
        name, doc, buckets=cumulative_buckets(h), sum_value=h.get("sum", 0.0) / 1000.0
    )


def renamed(family: Metric, name: str) -> Metric:
    """A copy of ``family`` under another name (its samples' names follow)."""
    copy = Metric(name, family.documentation, family.type)
    copy.samples = [x._replace(name=name + x.name[len(family.name) :]) for x in family.samples]
    return copy


Snapshots = list[tuple[str, dict[str, Any] | None]]  # (core, its snapshot or None: down)


class CoreCollector(Collector):
    """Families built from the last snapshots handed to ``set_snapshots``. Every core series
    carries ``model_name`` (the served model's id, as vLLM's do); with several cores, also a
    ``core`` label (its socket path). With ``vllm_names``, the families vLLM also has are
    exported a second time under ``vllm:<name>``."""

    def __init__(self, vllm_names: bool = False) -> None:
        self._snapshots: Snapshots = [("", None)]
        self._model = ""
        self.vllm_names = vllm_names

    def set_snapshot(self, snapshot: dict[str, Any] | None, model: str = "") -> None:
        self.set_snapshots([("", snapshot)], model)

    def set_snapshots(self, snapshots: Snapshots, model: str = "") -> None:
        self._snapshots, self._model = snapshots, model

    def describe(self) -> list[Metric]:
        return []  # families vary with the snapshot; skip registry-time checks

    def collect(self) -> Iterator[Metric]:
        by_core = len(self._snapshots) > 1
        up = GaugeMetricFamily(
            "uma_core_up",
            "1 when the core answered the metrics request.",
            labels=["core"] if by_core else [],
        )
        for core, snap in self._snapshots:
            up.add_metric([core] if by_core else [], 1.0 if snap is not None else 0.0)
        yield up
        for family in self._families(by_core):
            yield family
            short = family.name.removeprefix("uma_")
            if self.vllm_names and short in VLLM_NAMES:
                yield renamed(family, f"vllm:{short}")

    def _families(self, by_core: bool) -> Iterator[Metric]:
        base = ["model_name", "core"] if by_core else ["model_name"]
        live = [
            ([self._model, core] if by_core else [self._model], s)
            for core, s in self._snapshots
            if s is not None
        ]
        if not live:
            return

        def family(kind: type, name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return kind(name, doc, labels=[*base, *labels])

        def flat(table: dict[str, tuple[str, str]], kind: type, scale: float = 1.0):
            for key, (name, doc) in table.items():
                fam = family(kind, name, doc)
                for labels, snap in live:
                    if key in snap:
                        fam.add_metric(labels, float(snap[key]) * scale)
                if fam.samples:
                    yield fam

        def histograms(group: str, table: dict[str, tuple[str, str]], scale: float = 1e-3):
            for key, (name, doc) in table.items():
                fam = family(HistogramMetricFamily, name, doc)
                for labels, snap in live:
                    if h := (snap.get(group) or {}).get(key):
                        fam.add_metric(
                            labels, cumulative_buckets(h, scale), h.get("sum", 0.0) * scale
                        )
                if fam.samples:
                    yield fam

        yield from flat(GAUGES, GaugeMetricFamily)
        yield from flat(ALIAS_GAUGES, GaugeMetricFamily)
        yield from flat(MS_GAUGES, GaugeMetricFamily, 1e-3)
        tick = family(GaugeMetricFamily, *TICK_TOKENS, labels=("phase",))
        for labels, snap in live:
            for phase, n in (snap.get("tokens_per_tick") or {}).items():
                tick.add_metric([*labels, phase], float(n))
        yield tick
        yield from flat(COUNTERS, CounterMetricFamily)
        done = family(CounterMetricFamily, *SUCCESS, labels=("finished_reason",))
        for labels, snap in live:
            for reason, n in (snap.get("requests_total") or {}).items():
                done.add_metric([*labels, reason], float(n))
        yield done
        yield from histograms("histograms", HISTOGRAMS)
        yield from histograms("histograms", ALIAS_HISTOGRAMS)
        yield from histograms("token_histograms", TOKEN_HISTOGRAMS, 1.0)
        for key, (name, doc) in QOS_HISTOGRAMS.items():
            fam = family(HistogramMetricFamily, name, doc, labels=("qos",))
            for labels, snap in live:
                for qos, h in ((snap.get("histograms_by_qos") or {}).get(key) or {}).items():
                    fam.add_metric(
                        [*labels, qos], cumulative_buckets(h), h.get("sum", 0.0) / 1000.0
                    )
            if fam.samples:
                yield fam


TICK_TOKENS = ("uma_tick_tokens", "Tokens in the last tick, by phase.")
SUCCESS = ("uma_request_success_total", "Requests finished in the core, by finish reason.")


CLIENT_CLOSED = 499  # nginx's "client closed request"
HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


ADDED_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1)


class GatewayMetrics:
    """The gateway's registry: the core collector plus its own HTTP counters."""

    def __init__(self, vllm_names: bool = False) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.core = CoreCollector(vllm_names)
        self.registry.register(self.core)
        self.http_requests = Counter(
            "uma_http_requests",
            "HTTP requests answered by the gateway, by route, method and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.http_latency = Histogram(
            "uma_http_request_duration_seconds",
            "HTTP request time until the last byte of the response (streams included).",
            ["route", "method"],
            buckets=HTTP_BUCKETS,
            registry=self.registry,
        )
        self.added_latency = Histogram(
            "uma_gateway_added_latency_seconds",
            "What the gateway adds to a stream's time to first token: request arrival to the "
            "core request sent, plus the first core event to the first body byte handed out.",
            buckets=ADDED_BUCKETS,
            registry=self.registry,
        )
        self.routed = Counter(
            "uma_gateway_routed_requests",
            "Core requests sent to each core (several cores), by why that core: affinity, "
            "balance (the preferred core was busy), round_robin, retry (an earlier core failed).",
            ["core", "reason"],
            registry=self.registry,
        )
        self.inflight = Gauge(
            "uma_http_inflight_requests",
            "Generation requests the gateway holds now (counted against --max-inflight).",
            registry=self.registry,
        )


class HttpMetricsMiddleware:
    """Pure ASGI middleware (no body buffering, safe for SSE): counts every answer."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics, routes: set[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes

    def route_of(self, path: str) -> str:
        if path in self.routes:
            return path
        if path.startswith("/v1/models/"):
            return "/v1/models/{model}"
        return "unmatched"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        scope.setdefault("state", {})["uma_arrival"] = start  # routes time the gateway's share
        status = 500
        finished = gone = False

        async def receive_wrapper() -> Message:
            nonlocal gone
            message = await receive()
            if message["type"] == "http.disconnect" and not finished:
                gone = True
            return message

        async def send_wrapper(message: Message) -> None:
            nonlocal status, finished
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                finished = True
            await send(message)

        try:
            await self.app(scope, receive_wrapper, send_wrapper)
        finally:
            if gone and not finished:
                status = CLIENT_CLOSED  # the client left before the whole answer was sent
            route, method = self.route_of(scope["path"]), scope["method"]
            self.metrics.http_requests.labels(route, method, str(status)).inc()
            self.metrics.http_latency.labels(route, method).observe(time.perf_counter() - start)
