"""Prometheus export: the core's figures from its snapshot at scrape time, plus HTTP metrics.

The core keeps the only bookkeeping of tokens, latencies and queue state; ``CoreCollector``
turns one ``metrics`` snapshot into metric families on each scrape (milliseconds become
seconds, per-bucket counts become cumulative ``le`` buckets). The gateway itself only counts
its own HTTP traffic. Names follow vLLM's with the ``uma_`` prefix, and where ours differ
vLLM's are exported too, with its ``model_name`` label (docs/METRICS.md), so that a vLLM
dashboard works here; ``promtool check metrics`` finds nothing to flag (a test runs it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, NamedTuple

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

from uma_serve.core import protocol as p

# The *_created series only add noise for a long-running gateway's counters.
disable_created_metrics()


class Export(NamedTuple):
    """One family derived from a snapshot field: ``key`` in its parent, the family's name and
    help, and the snapshot units per exported unit (1000: ms exported in seconds)."""

    key: str
    name: str
    help: str
    per_unit: float = 1.0


def _families(kind: str, under: str = "") -> list[Export]:
    """The families of one kind, from protocol.MetricsSnapshot (the one declaration of the
    core's figures; docs/METRICS.md is generated from it too). A field vLLM names otherwise
    is exported twice, the second time under vLLM's name."""
    out: list[Export] = []
    for path, _, meta in p.metric_fields():
        extra = meta.extra or {}
        parent, _, key = path.rpartition(".")
        if extra.get("prom") and parent == under and p.prom_kind(path, meta) == kind:
            name, doc, per_unit = extra["prom"], extra["prom_help"], extra["per_unit"]
            out.append(Export(key, name, doc, per_unit))
            if vllm := extra.get("vllm"):
                alias_doc = f"{doc.removesuffix('.')}; vLLM's name for {name}."
                out.append(Export(key, vllm, alias_doc, per_unit))
    return out


HISTOGRAMS = _families("histogram", "histograms")
TOKEN_HISTOGRAMS = _families("histogram", "token_histograms")
GAUGES = _families("gauge")
COUNTERS = _families("counter")
QOS_HISTOGRAMS = _families("histogram", "histograms_by_qos")
TICK_TOKENS = ("uma_tick_tokens", "Tokens in the last tick, by phase.")
SUCCESS = ("uma_request_success_total", "Requests finished in the core, by finish reason.")
# Our families that vLLM exports under the same name after its prefix (vllm:<name>; a
# counter's without _total): with --vllm-metric-names they are exported once more so.
VLLM_NAMES = frozenset({
    "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
    "time_to_first_token_seconds", "time_per_output_token_seconds",
    "inter_token_latency_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
    "request_prompt_tokens", "request_generation_tokens", "prompt_tokens", "generation_tokens",
    "request_success", "request_prefill_time_seconds", "request_decode_time_seconds",
    "request_max_num_generation_tokens",
})  # fmt: skip
# vLLM's older names of the same families (its stock Grafana dashboard still reads them)
VLLM_OLD_NAMES = {"kv_cache_usage_perc": "gpu_cache_usage_perc"}


def cumulative_buckets(h: dict[str, Any], per_unit: float = 1000.0) -> list[tuple[str, float]]:
    """Core histogram (per-bucket counts) -> cumulative ``le`` buckets, bounds divided by
    ``per_unit`` (milliseconds to seconds by default)."""
    buckets: list[tuple[str, float]] = []
    running = 0
    counts = h.get("counts", [])
    for bound, n in zip(h.get("bounds", []), counts, strict=False):
        running += n
        buckets.append((repr(bound / per_unit), running))
    buckets.append(("+Inf", h.get("count", sum(counts))))
    return buckets


def histogram_family(
    name: str, doc: str, h: dict[str, Any], per_unit: float = 1000.0
) -> HistogramMetricFamily:
    return HistogramMetricFamily(
        name, doc, buckets=cumulative_buckets(h, per_unit), sum_value=h.get("sum", 0.0) / per_unit
    )


def renamed(family: Metric, name: str) -> Metric:
    """A copy of ``family`` under another name (its samples' names follow)."""
    copy = Metric(name, family.documentation, family.type)
    copy.samples = [s._replace(name=name + s.name[len(family.name) :]) for s in family.samples]
    return copy


class CoreSnapshot(NamedTuple):
    """One core's part of a scrape."""

    core: str  # its socket path: the ``core`` label with several cores
    model: str  # the model it serves, as /v1/models names it: the ``model_name`` label
    snapshot: dict[str, Any] | None  # None: it did not answer


Live = list[tuple[list[str], dict[str, Any]]]  # (a live core's label values, its snapshot)


class CoreCollector(Collector):
    """Families built from the last snapshots handed to ``set_snapshots``. Every series but
    ``uma_core_up`` carries ``model_name`` (as vLLM's do); with several cores every series
    also carries ``core`` (its socket path), with one core none does."""

    def __init__(self, vllm_names: bool = False) -> None:
        self._snapshots = [CoreSnapshot("", "", None)]
        self.vllm_names = vllm_names  # also export vLLM's families under "vllm:" names

    def set_snapshot(self, snapshot: dict[str, Any] | None, model: str = "") -> None:
        self._snapshots = [CoreSnapshot("", model, snapshot)]

    def set_snapshots(self, snapshots: list[CoreSnapshot]) -> None:
        self._snapshots = snapshots

    def describe(self) -> list[Metric]:
        return []  # families vary with the snapshot; skip registry-time checks

    def collect(self) -> Iterator[Metric]:
        by_core = len(self._snapshots) > 1
        up = GaugeMetricFamily(
            "uma_core_up",
            "1 when the core answered the metrics request.",
            labels=["core"] if by_core else [],
        )
        for s in self._snapshots:
            up.add_metric([s.core] if by_core else [], 1.0 if s.snapshot is not None else 0.0)
        yield up
        base = ["core", "model_name"] if by_core else ["model_name"]
        live = [
            ([s.core, s.model] if by_core else [s.model], s.snapshot)
            for s in self._snapshots
            if s.snapshot is not None
        ]
        if not live:
            return
        for family in core_families(base, live):
            yield family
            short = family.name.removeprefix("uma_")
            if self.vllm_names and short in VLLM_NAMES:
                yield renamed(family, f"vllm:{short}")
                if old := VLLM_OLD_NAMES.get(short):
                    yield renamed(family, f"vllm:{old}")


def core_families(base: list[str], live: Live) -> Iterator[Metric]:
    """Every family of the live cores' snapshots, each series labeled ``base`` (its values
    first in each entry of ``live``)."""

    def flat(table: list[Export], kind: type) -> Iterator[Metric]:
        for key, name, doc, per_unit in table:
            fam = kind(name, doc, labels=base)
            for labels, snap in live:
                if key in snap:
                    fam.add_metric(labels, float(snap[key]) / per_unit)
            if fam.samples:
                yield fam

    def by_label(name: str, doc: str, label: str, field: str) -> Metric:
        kind = CounterMetricFamily if name.endswith("_total") else GaugeMetricFamily
        fam = kind(name, doc, labels=[*base, label])
        for labels, snap in live:
            for value, n in (snap.get(field) or {}).items():
                fam.add_metric([*labels, value], float(n))
        return fam

    yield from flat(GAUGES, GaugeMetricFamily)
    yield by_label(*TICK_TOKENS, "phase", "tokens_per_tick")
    yield from flat(COUNTERS, CounterMetricFamily)
    yield by_label(*SUCCESS, "finished_reason", "requests_total")
    yield from histograms(base, live, HISTOGRAMS, "histograms")
    yield from histograms(base, live, TOKEN_HISTOGRAMS, "token_histograms")
    yield from histograms(base, live, QOS_HISTOGRAMS, "histograms_by_qos", "qos")


def histograms(
    base: list[str], live: Live, table: list[Export], under: str, label: str = ""
) -> Iterator[Metric]:
    """The histogram families of the snapshots' ``under``; with ``label``, each field is a
    dict of histograms by that label's value (the QoS class)."""
    for key, name, doc, per_unit in table:
        fam = HistogramMetricFamily(name, doc, labels=[*base, label] if label else base)
        for labels, snap in live:
            field = (snap.get(under) or {}).get(key)
            for value, h in (field or {}).items() if label else [("", field)]:
                if h:
                    buckets, total = cumulative_buckets(h, per_unit), h.get("sum", 0.0) / per_unit
                    fam.add_metric([*labels, value] if label else labels, buckets, total)
        if fam.samples:
            yield fam


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
