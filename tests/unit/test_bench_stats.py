"""Bench metrics: pure functions on hand-made token timelines."""

from uma_serve.bench import stats


def test_percentile_matches_linear_interpolation():
    xs = [10, 20, 30, 40, 50]
    assert stats.percentile(xs, 50) == 30
    assert stats.percentile(xs, 0) == 10
    assert stats.percentile(xs, 100) == 50
    assert stats.percentile(xs, 95) == 48
    assert stats.percentile([7], 99) == 7
    assert stats.percentile([], 50) is None


def test_ttft_ttf5_gaps_tpot():
    ts = [100.0, 130.0, 160.0, 190.0, 220.0, 250.0]
    assert stats.ttft(ts) == 100
    assert stats.ttf_n(ts, 5) == 220
    assert stats.ttf_n(ts[:4], 5) is None
    assert stats.gaps(ts) == [30] * 5
    assert stats.tpot(ts, 6) == 30
    assert stats.tpot(ts[:1], 1) is None


def test_worst_pause_only_counts_the_first_three_seconds():
    ts = [50.0, 80.0, 600.0, 630.0, 4000.0, 9000.0]
    # gaps ending by 3050 ms: 30, 520, 30 -> 520; the 3370 and 5000 ms gaps end later
    assert stats.worst_pause(ts) == 520
    assert stats.worst_pause([0.0, 5000.0]) == 5000  # the very first gap is past the window
    assert stats.worst_pause([10.0]) is None


def test_summary_aggregates_and_rates():
    s = stats.Summary(duration_s=2.0)
    s.add([100.0, 120.0, 140.0, 160.0, 180.0], 5, prompt_tokens=40)
    s.add([200.0, 230.0], 2, prompt_tokens=60)
    d = s.to_dict()
    assert d["requests"] == 2 and d["output_tokens"] == 7 and d["prompt_tokens"] == 100
    assert d["output_tok_per_s"] == 3.5
    assert d["request_per_s"] == 1.0
    assert d["ttft_p50_ms"] == 150
    assert d["itl_max_ms"] == 30
    assert d["ttf5_p50_ms"] == 180  # only the first stream has five tokens
    assert d["e2e_max_ms"] == 230
    assert stats.ratio(30.0, 20.0) == 1.5 and stats.ratio(1.0, None) is None


def test_slow_share_counts_gaps_over_the_line_after_each_streams_first_ones() -> None:
    a = [0.0, 10.0, 12.0, 14.0, 30.0]  # gaps 10, 2, 2, 16
    b = [0.0, 2.0, 4.0]  # gaps 2, 2
    assert stats.slow_share([a, b], over_ms=5.0) == round(2 / 6, 4)
    assert stats.slow_share([a, b], over_ms=5.0, skip=1) == round(1 / 4, 4)
    assert stats.slow_share([[1.0]], over_ms=5.0) is None
