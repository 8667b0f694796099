"""The scorecard written beside each run's summary (``scorecard.json``): what the server saw
during the run, from its Prometheus metrics scraped before and after (UMA Serve through its
gateway; other targets have none).

p50/p95/p99 of TTFT, inter-token latency and tick time (``llama_decode`` launch to device
done), of each tick's sampling, tokens per tick, and the engine's *idle share*: the part of
its busy wall time outside launch-to-device-done (host work the device waits for: sampling,
detokenizing, scheduling, events). On a GPU that share is the device's idle time, the figure
host work must drive down; without a GPU it is the engine's own overhead. And the share of
ticks whose decode graph was built anew (a GPU then runs it, and the tick after, without
replaying a captured CUDA graph).
"""

from __future__ import annotations

from collections import defaultdict

import httpx
from prometheus_client.parser import text_string_to_metric_families

from uma_serve.bench.targets import HttpTarget, Target

HISTOGRAMS = {
    "ttft": "uma_time_to_first_token_seconds",
    "itl": "uma_inter_token_latency_seconds",
    "tick": "uma_tick_decode_seconds",
    "sample": "uma_tick_sample_seconds",
}
COUNTERS = (
    "uma_batch_calls_total",
    "uma_generation_tokens_total",
    "uma_prompt_tokens_total",
    "uma_decode_graph_rebuilds_total",
)
BUSY, HOST = "uma_engine_busy_seconds_total", "uma_engine_host_seconds_total"

Scrape = dict[str, dict]  # family -> {"buckets": {le: cumulative count}, "sum", "count"} or value


async def scrape(target: Target) -> Scrape | None:
    """The server's metrics now; None for a target without UMA's /metrics."""
    if not isinstance(target, HttpTarget) or not target.name.startswith("uma"):
        return None
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            r = await client.get(target.base_url.removesuffix("/v1") + "/metrics")
    except httpx.HTTPError:
        return None
    return parse(r.text) if r.status_code == 200 else None


def parse(text: str) -> Scrape:
    out: Scrape = {}
    for family in text_string_to_metric_families(text):
        if family.name in HISTOGRAMS.values():
            h = {"buckets": defaultdict(float), "sum": 0.0, "count": 0.0}
            for s in family.samples:
                if s.name.endswith("_bucket"):
                    h["buckets"][float(s.labels["le"])] += s.value
                elif s.name.endswith("_sum"):
                    h["sum"] += s.value
                elif s.name.endswith("_count"):
                    h["count"] += s.value
            out[family.name] = h
        elif {family.name, family.name + "_total"} & {*COUNTERS, BUSY, HOST}:
            name = family.name if family.name.endswith("_total") else family.name + "_total"
            out[name] = {"value": sum(s.value for s in family.samples)}
    return out


def quantile(buckets: dict[float, float], q: float) -> float | None:
    """The q-quantile of a histogram from its cumulative buckets (linear within a bucket,
    Prometheus' histogram_quantile)."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0
    if total <= 0:
        return None
    rank, lo, below = q * total, 0.0, 0.0
    for le in bounds:
        if buckets[le] >= rank:
            if le == float("inf"):
                return lo
            width = buckets[le] - below
            return lo + (le - lo) * ((rank - below) / width if width else 1.0)
        lo, below = le, buckets[le]
    return lo


def card(before: Scrape, after: Scrape) -> dict:
    """The run's figures: histogram and counter differences between the two scrapes (ms)."""
    out: dict = {}
    for key, name in HISTOGRAMS.items():
        a, b = after.get(name), before.get(name, {"buckets": {}, "sum": 0.0, "count": 0.0})
        if a is None:
            continue
        delta = {le: n - b["buckets"].get(le, 0.0) for le, n in a["buckets"].items()}
        for q in (50, 95, 99):
            v = quantile(delta, q / 100)
            out[f"{key}_p{q}_ms"] = None if v is None else round(v * 1e3, 3)
        out[f"{key}_count"] = int(a["count"] - b["count"])
        out[f"{key}_sum_s"] = round(a["sum"] - b["sum"], 4)

    def diff(name: str) -> float | None:
        if name not in after:
            return None
        return after[name]["value"] - before.get(name, {"value": 0.0})["value"]

    ticks = diff("uma_batch_calls_total")
    tokens = [diff(n) for n in ("uma_generation_tokens_total", "uma_prompt_tokens_total")]
    if ticks and None not in tokens:
        out["tokens_per_tick"] = round(sum(t for t in tokens if t) / ticks, 2)
    if ticks and (rebuilt := diff("uma_decode_graph_rebuilds_total")) is not None:
        out["graph_rebuild_share"] = round(rebuilt / ticks, 3)
    busy, host = diff(BUSY), diff(HOST)
    if busy and host is not None:
        out["engine_idle_share"] = round(host / busy, 3)
    return out
