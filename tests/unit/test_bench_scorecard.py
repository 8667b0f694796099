"""bench's scorecard: the run's share of the server's histograms and counters."""

from __future__ import annotations

import pytest

from uma_serve.bench.scorecard import card, parse, quantile


def exposition(
    ticks: list[float], busy: float, calls: int, tokens: int, host: float = 0, rebuilt: int = 0
) -> str:
    """Prometheus text as the gateway writes it (prometheus_client's exposition), for a
    histogram of tick times (s)."""
    bounds = [0.001, 0.002, 0.005, float("inf")]
    lines = ["# TYPE uma_tick_decode_seconds histogram"]
    for le in bounds:
        n = sum(1 for t in ticks if t <= le)
        label = "+Inf" if le == float("inf") else repr(le)
        lines.append(f'uma_tick_decode_seconds_bucket{{le="{label}"}} {n}')
    lines += [
        f"uma_tick_decode_seconds_sum {sum(ticks)}",
        f"uma_tick_decode_seconds_count {len(ticks)}",
        "# TYPE uma_engine_busy_seconds_total counter",
        f"uma_engine_busy_seconds_total {busy}",
        "# TYPE uma_engine_host_seconds_total counter",
        f"uma_engine_host_seconds_total {host}",
        "# TYPE uma_batch_calls_total counter",
        f"uma_batch_calls_total {calls}",
        "# TYPE uma_generation_tokens_total counter",
        f"uma_generation_tokens_total {tokens}",
        "# TYPE uma_prompt_tokens_total counter",
        f"uma_prompt_tokens_total {tokens // 2}",
        "# TYPE uma_decode_graph_rebuilds_total counter",
        f"uma_decode_graph_rebuilds_total {rebuilt}",
    ]
    return "\n".join(lines) + "\n"


def test_quantile_interpolates_within_a_bucket() -> None:
    buckets = {1.0: 0.0, 2.0: 10.0, 4.0: 20.0, float("inf"): 20.0}
    assert quantile(buckets, 0.5) == pytest.approx(2.0)
    assert quantile(buckets, 0.25) == pytest.approx(1.5)
    assert quantile(buckets, 0.75) == pytest.approx(3.0)
    assert quantile({float("inf"): 0.0}, 0.5) is None


def test_the_card_counts_only_the_run() -> None:
    before = parse(exposition([0.004] * 100, busy=1.0, calls=100, tokens=300, host=0.4, rebuilt=9))
    # the run: 200 ticks of 1.5 ms in 0.5 s of busy time, 30 tokens a tick, 20 graphs built
    after = parse(
        exposition([0.004] * 100 + [0.0015] * 200, 1.5, 300, 300 + 4000, host=0.6, rebuilt=29)
    )
    c = card(before, after)
    assert c["tick_count"] == 200
    assert 1.0 < c["tick_p50_ms"] <= 2.0 and c["tick_p99_ms"] <= 2.0  # the earlier 4 ms ticks
    assert c["tick_sum_s"] == pytest.approx(0.3)
    assert c["engine_idle_share"] == pytest.approx(0.2 / 0.5)
    assert c["tokens_per_tick"] == pytest.approx((4000 + 2000) / 200)
    assert c["graph_rebuild_share"] == pytest.approx(20 / 200)
    assert "ttft_p50_ms" not in c  # not in the exposition: left out, not zero
