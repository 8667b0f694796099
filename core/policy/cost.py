"""The tick-time model the policy predicts with: a tick's wall time from its composition.

    ms ≈ a + b·decode_tokens + c·prefill_tokens + d·(Σ attended KV cells / 1000)
         + e·[the tick carries any prefill]

The step ``e`` is what a GPU shows: a decode-only tick runs as one captured CUDA graph, and a
tick with any prompt tokens in it costs a few ms more whatever their number (H100: 1.4 ms vs
4.1 ms for one prompt token, 9.1 ms for 256). On a CPU it fits to about zero.

``TickCost`` is the immutable coefficient snapshot; the engine's ``OnlineTickModel``
(core/engine/tickmodel.py) refits it after every tick. It is the one cost estimate: the
baseline's prefill budget, the guards, speculation and the interactive allowance all use it.
"""

from __future__ import annotations

import msgspec


class TickShape(msgspec.Struct, frozen=True):
    decode: int  # rows with logits: each decoding sequence's token and its drafted tokens
    prefill: int  # prompt tokens
    kv_k: float  # Σ over the batch's tokens of KV cells attended, in thousands

    def __add__(self, other: TickShape) -> TickShape:
        return TickShape(
            self.decode + other.decode, self.prefill + other.prefill, self.kv_k + other.kv_k
        )

    def features(self) -> tuple[float, float, float, float, float]:
        return (1.0, float(self.decode), float(self.prefill), self.kv_k, float(self.prefill > 0))


class TickCost(msgspec.Struct, frozen=True):
    a: float = 15.0  # ms per tick (graph, LM head for one row, sampling set-up)
    b: float = 4.0  # ms per decoding sequence (its logits row, its sampler)
    c: float = 3.0  # ms per prefill token
    d: float = 0.05  # ms per thousand KV cells attended
    e: float = 0.0  # ms a tick costs more as soon as it carries any prefill (the step)
    samples: int = 0  # ticks fitted so far (0: the defaults above, a CPU-sized guess)

    def predict(self, shape: TickShape) -> float:
        f = shape.features()
        linear = self.a * f[0] + self.b * f[1] + self.c * f[2] + self.d * f[3]
        return max(linear + self.e * f[4], 0.0)

    def prefill_that_fits(self, decode: int, kv_k: float, budget_ms: float) -> int:
        """Largest prefill token count whose predicted tick stays within budget_ms."""
        base = self.predict(TickShape(decode, 0, kv_k)) + self.e
        if base > budget_ms:
            return 0
        return int(min((budget_ms - base) / max(self.c, 1e-3), 1 << 30))

    def stepped(self, min_tokens: int) -> bool:
        """The step costs more than ``min_tokens`` prompt tokens: small prefill chunks are
        mostly step, so prefill should come in few large chunks (a GPU), not many small ones."""
        return self.e > min_tokens * max(self.c, 1e-3)


# What a context's model starts from until it has measured its own ticks (core/engine/
# tickmodel.py). TickCost() is CPU-sized; on a GPU it says a prompt token costs 3 ms, so the
# guard let two chat turns' prompts into a tick while others decode, and a burst of 16 chat
# turns on an H100 was prefilled over 11 ticks (Gemma-3-4B's shape, the first 180 ms of a
# fresh server); their streams then stayed staggered, each later turn a prompt tick of its own.
# This is Gemma 3 270M's fit on an H100 (docs/POLICY.md).
GPU_PRIOR = TickCost(a=1.1, b=0.3, c=0.016, d=0.05, e=3.5)
