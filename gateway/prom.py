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

from uma_serve.core import protocol as p

# The *_created series only add noise for a long-running gateway's counters.
disable_created_metrics()


def _families(kind: str, under: str = "") -> dict[str, tuple[str, str]]:
    """snapshot key -> (metric name, help) of one kind, from protocol.MetricsSnapshot (the one
    declaration of the core's figures; docs/METRICS.md is generated from it too)."""
    out: dict[str, tuple[str, str]] = {}
    for path, _, meta in p.metric_fields():
        extra = meta.extra or {}
        parent, _, key = path.rpartition(".")
        if extra.get("prom") and parent == under and p.prom_kind(path, meta) == kind:
            out[key] = (extra["prom"], extra["prom_help"])
    return out


HISTOGRAMS = _families("histogram", "histograms")
GAUGES = _families("gauge")
COUNTERS = _families("counter")
QOS_HISTOGRAMS = _families("histogram", "histograms_by_qos")


def cumulative_buckets(h: dict[str, Any]) -> list[tuple[str, float]]:
    """Core histogram (ms bounds, per-bucket counts) -> cumulative ``le`` buckets in seconds."""
    buckets: list[tuple[str, float]] = []
    running = 0
    counts = h.get("counts", [])
    for bound, n in zip(h.get("bounds", []), counts, strict=False):
        running += n
        buckets.append((repr(bound / 1000.0), running))
    buckets.append(("+Inf", h.get("count", sum(counts))))
    return buckets


def histogram_family(name: str, doc: str, h: dict[str, Any]) -> HistogramMetricFamily:
    return HistogramMetricFamily(
        name, doc, buckets=cumulative_buckets(h), sum_value=h.get("sum", 0.0) / 1000.0
    )


Snapshots = list[tuple[str, dict[str, Any] | None]]  # (core, its snapshot or None: down)


class CoreCollector(Collector):
    """Families built from the last snapshots handed to ``set_snapshots``. One core: the
    series carry no ``core`` label; several: every series carries one (its socket path)."""

    def __init__(self) -> None:
        self._snapshots: Snapshots = [("", None)]

    def set_snapshot(self, snapshot: dict[str, Any] | None) -> None:
        self._snapshots = [("", snapshot)]

    def set_snapshots(self, snapshots: Snapshots) -> None:
        self._snapshots = snapshots

    def describe(self) -> list[Metric]:
        return []  # families vary with the snapshot; skip registry-time checks

    def collect(self) -> Iterator[Metric]:
        by_core = len(self._snapshots) > 1
        base = ["core"] if by_core else []
        live = [(([core] if by_core else []), s) for core, s in self._snapshots if s is not None]

        def family(kind: type, name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return kind(name, doc, labels=[*base, *labels])

        up = family(
            GaugeMetricFamily, "uma_core_up", "1 when the core answered the metrics request."
        )
        for core, snap in self._snapshots:
            up.add_metric([core] if by_core else [], 1.0 if snap is not None else 0.0)
        yield up
        if not live:
            return

        def flat(table: dict[str, tuple[str, str]], kind: type) -> Iterator[Metric]:
            for key, (name, doc) in table.items():
                fam = family(kind, name, doc)
                for labels, snap in live:
                    if key in snap:
                        fam.add_metric(labels, float(snap[key]))
                if fam.samples:
                    yield fam

        yield from flat(GAUGES, GaugeMetricFamily)
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
        for key, (name, doc) in HISTOGRAMS.items():
            fam = family(HistogramMetricFamily, name, doc)
            for labels, snap in live:
                if h := (snap.get("histograms") or {}).get(key):
                    fam.add_metric(labels, cumulative_buckets(h), h.get("sum", 0.0) / 1000.0)
            if fam.samples:
                yield fam
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

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.core = CoreCollector()
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
