"""Tick-time model: predict a tick's wall time from its composition, fitted online.

    ms ≈ a + b·decode_tokens + c·prefill_tokens + d·(Σ attended KV cells / 1000)

``TickCost`` is the immutable coefficient snapshot the policy predicts with;
``OnlineTickModel`` (owned by the engine) refits it after every tick by recursive least
squares with forgetting, so the model follows the machine as its speed drifts.
"""

from __future__ import annotations

from dataclasses import dataclass

N_FEATURES = 4


@dataclass(frozen=True, slots=True)
class TickShape:
    decode: int  # sequences decoding one token
    prefill: int  # prompt tokens
    kv_k: float  # Σ over the batch's tokens of KV cells attended, in thousands

    def features(self) -> tuple[float, float, float, float]:
        return (1.0, float(self.decode), float(self.prefill), self.kv_k)


@dataclass(frozen=True, slots=True)
class TickCost:
    a: float = 15.0  # ms per tick (graph, LM head for one row, sampling set-up)
    b: float = 4.0  # ms per decoding sequence (its logits row, its sampler)
    c: float = 3.0  # ms per prefill token
    d: float = 0.05  # ms per thousand KV cells attended
    samples: int = 0  # ticks fitted so far (0: the defaults above, a CPU-sized guess)

    def predict(self, shape: TickShape) -> float:
        f = shape.features()
        return max(self.a * f[0] + self.b * f[1] + self.c * f[2] + self.d * f[3], 0.0)

    def prefill_that_fits(self, decode: int, kv_k: float, budget_ms: float) -> int:
        """Largest prefill token count whose predicted tick stays within budget_ms."""
        base = self.predict(TickShape(decode, 0, kv_k))
        if base > budget_ms:
            return 0
        return int(min((budget_ms - base) / max(self.c, 1e-3), 1 << 30))


class OnlineTickModel:
    """Recursive least squares with forgetting factor ``lam`` over TickShape features."""

    def __init__(self, prior: TickCost | None = None, lam: float = 0.995) -> None:
        prior = prior or TickCost()
        self.theta = [prior.a, prior.b, prior.c, prior.d]
        self.P = [[100.0 if i == j else 0.0 for j in range(N_FEATURES)] for i in range(N_FEATURES)]
        self.lam = lam
        self.samples = 0

    @property
    def cost(self) -> TickCost:
        a, b, c, d = self.theta
        return TickCost(a, max(b, 0.0), max(c, 0.0), max(d, 0.0), self.samples)

    def update(self, shape: TickShape, ms: float) -> None:
        x = shape.features()
        P, lam = self.P, self.lam
        px = [sum(P[i][j] * x[j] for j in range(N_FEATURES)) for i in range(N_FEATURES)]
        denom = lam + sum(x[i] * px[i] for i in range(N_FEATURES))
        k = [v / denom for v in px]
        predicted = sum(t * v for t, v in zip(self.theta, x, strict=True))
        # robust to outliers (a preempted tick, a page fault storm): clip the error
        bound = max(5.0, 0.5 * abs(predicted)) if self.samples > 20 else float("inf")
        err = min(max(ms - predicted, -bound), bound)
        self.theta = [t + ki * err for t, ki in zip(self.theta, k, strict=True)]
        xp = [sum(x[i] * P[i][j] for i in range(N_FEATURES)) for j in range(N_FEATURES)]
        self.P = [
            [(P[i][j] - k[i] * xp[j]) / lam for j in range(N_FEATURES)] for i in range(N_FEATURES)
        ]
        self.samples += 1
