"""Serving-benchmark metrics as pure functions over per-request token timestamps.

Definitions follow vLLM's serving benchmark (benchmarks/benchmark_serving.py):
- TTFT: send -> first chunk that carries text.
- ITL: every gap between consecutive content chunks (all requests' gaps pooled).
- TPOT: (E2E - TTFT) / (output tokens - 1), per request.
- E2E: send -> last chunk.
Plus two figures a user feels directly:
- worst pause: the longest gap between content chunks in the first 3 s after the first one.
- TTF5: send -> fifth content chunk (None when the stream had fewer).
All times in and out are milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


def percentile(values: Iterable[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]; None for no data."""
    xs = sorted(values)
    if not xs:
        return None
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def mean(values: Iterable[float]) -> float | None:
    xs = list(values)
    return sum(xs) / len(xs) if xs else None


def gaps(token_ms: Sequence[float]) -> list[float]:
    """Inter-token gaps of one stream (token_ms: arrival times of content chunks)."""
    return [b - a for a, b in zip(token_ms, token_ms[1:], strict=False)]


def ttft(token_ms: Sequence[float]) -> float | None:
    """token_ms are relative to the send time, so TTFT is the first one."""
    return token_ms[0] if token_ms else None


def ttf_n(token_ms: Sequence[float], n: int = 5) -> float | None:
    return token_ms[n - 1] if len(token_ms) >= n else None


def worst_pause(token_ms: Sequence[float], window_ms: float = 3000.0) -> float | None:
    """Longest gap between content chunks that ends within window_ms of the first chunk."""
    if len(token_ms) < 2:
        return None
    end = token_ms[0] + window_ms
    inside = [g for g, t in zip(gaps(token_ms), token_ms[1:], strict=False) if t <= end]
    if not inside:  # the second chunk itself came after the window: that gap is the pause
        return token_ms[1] - token_ms[0]
    return max(inside)


def slow_share(streams: Iterable[Sequence[float]], over_ms: float, skip: int = 0) -> float | None:
    """Share of the streams' gaps longer than over_ms, each stream's first ``skip`` gaps left
    out. A p95 says where the 95th percentile falls; this says how many gaps are slow, which
    compares two phases even when the p95 sits on the edge of a cluster of slow gaps."""
    pooled = [g for token_ms in streams for g in gaps(token_ms)[skip:]]
    return round(sum(g > over_ms for g in pooled) / len(pooled), 4) if pooled else None


def tpot(token_ms: Sequence[float], n_tokens: int) -> float | None:
    if not token_ms or n_tokens < 2:
        return None
    return (token_ms[-1] - token_ms[0]) / (n_tokens - 1)


@dataclass
class Summary:
    """Aggregates over a set of streams (one scenario class)."""

    requests: int = 0
    failed: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0
    duration_s: float = 0.0
    ttft: list[float] = field(default_factory=list)
    ttf5: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    worst_pause: list[float] = field(default_factory=list)

    def add(self, token_ms: Sequence[float], n_tokens: int, prompt_tokens: int = 0) -> None:
        self.requests += 1
        self.output_tokens += n_tokens
        self.prompt_tokens += prompt_tokens
        for target, value in (
            (self.ttft, ttft(token_ms)),
            (self.ttf5, ttf_n(token_ms, 5)),
            (self.tpot, tpot(token_ms, n_tokens)),
            (self.e2e, token_ms[-1] if token_ms else None),
            (self.worst_pause, worst_pause(token_ms)),
        ):
            if value is not None:
                target.append(value)
        self.itl.extend(gaps(token_ms))

    def to_dict(self) -> dict[str, float | int | None]:
        out: dict[str, float | int | None] = {
            "requests": self.requests,
            "failed": self.failed,
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "duration_s": round(self.duration_s, 3),
            "output_tok_per_s": _rate(self.output_tokens, self.duration_s),
            "prompt_tok_per_s": _rate(self.prompt_tokens, self.duration_s),
            "request_per_s": _rate(self.requests - self.failed, self.duration_s),
        }
        for name in ("ttft", "ttf5", "itl", "tpot", "e2e", "worst_pause"):
            xs = getattr(self, name)
            out[f"{name}_mean_ms"] = _r(mean(xs))
            for q in (50, 95, 99):
                out[f"{name}_p{q}_ms"] = _r(percentile(xs, q))
            out[f"{name}_max_ms"] = _r(max(xs) if xs else None)
        return out


def ratio(value: float | None, base: float | None) -> float | None:
    if value is None or not base:
        return None
    return round(value / base, 3)


def _rate(n: int, seconds: float) -> float | None:
    return round(n / seconds, 3) if seconds > 0 else None


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)
