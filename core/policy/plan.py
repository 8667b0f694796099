"""The policy's data contract: each running sequence as the policy sees it, the limits it
plans within, and the Plan it returns (commands only: what to decode, whom to park).

Like vLLM's SchedulerOutput, a Plan is the whole contract between scheduler and executor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from uma_serve.core.policy.cost import TickShape

if TYPE_CHECKING:
    from uma_serve.core.policy.state import SchedulerState


class Phase(Enum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True, slots=True)
class SessionView:
    """One running sequence as the policy sees it (times in ns, monotonic clock)."""

    seq_id: int
    phase: Phase
    qos: str  # its work's class this tick, "interactive" | "background" (policy/work.py)
    prompt_len: int
    n_past: int  # tokens already in the KV cache
    pending_prefill: int  # prompt tokens not yet in the KV cache
    generated: int
    arrival_ns: int
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    last_progress_ns: int = 0  # last tick that advanced it (prefill chunk or token)
    burst: int = 0  # consecutive ticks it was served (0: parked last tick)
    draft: tuple[int, ...] = ()  # prompt-lookup proposal after the pending token (spec)
    spec_accept_ewma: float = 0.7  # per-token acceptance of verified drafts, smoothed


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What the bandwidth (ΣBMT) estimate and MoE shaping need to know about the model."""

    weights_bytes: int = 0
    kv_bytes_per_cell: int = 0  # K+V bytes one token adds to the cache, all layers
    n_expert: int = 0  # 0: dense
    n_expert_used: int = 0


@dataclass(frozen=True, slots=True)
class Constraints:
    n_batch: int  # the context's logical batch: tokens per llama_decode at most
    tick_budget_ms: float  # baseline: wall time one tick should stay within
    min_prefill_tokens: int = 16  # prefill chunk granted even when the budget is spent
    prefill_burst: int = 256  # tokens one session may prefill per round of the rotation
    max_prefill_tokens: int | None = None  # cap after a failed decode (no KV slot)
    # LatencyGuard
    slo_tbt_ms: float | None = None  # None: (1 + headroom) x predicted interactive decode tick
    slo_ttft_ms: float | None = None  # None: interactive prefill ticks up to bg_tick_ms
    headroom: float = 0.2
    bg_tick_ms: float = 60.0  # bound on ticks without interactive work
    # no interactive request for this long: ticks without interactive work are bounded by
    # n_batch only (the engine aborts such a tick when an interactive request arrives); 0: off
    quiet_ms: float = 0.0
    hold_ticks: int = 8  # hysteresis: ticks without background prefill after an overrun
    pause_every: int = 100  # stepped tick cost: pauses stretch one interactive gap in this many
    starve_ms: float = 2000.0  # any session waits at most this long between progress
    # ΣBMT guard (off when None)
    bmt_budget_gbs: float | None = None
    model: ModelFacts = ModelFacts()
    # SpeculativeDecode (off when spec_max_draft is 0)
    spec_max_draft: int = 0  # drafted tokens verified per stream per tick at most
    spec_max_streams: int = 2  # draft only while at most this many streams decode


@dataclass(frozen=True, slots=True)
class BatchItem:
    seq_id: int
    phase: Phase
    n_tokens: int  # a DECODE item: 1 (the pending token) + drafted tokens to verify
    logits: bool  # logits wanted for the item's last token (every token of a drafted decode)


@dataclass(frozen=True, slots=True)
class Plan:
    """One tick: items in batch order, sessions to park (skip) this tick, and the guards'
    decisions the tick is judged by afterwards (latency_guard.observe)."""

    items: tuple[BatchItem, ...] = ()
    parked: tuple[int, ...] = field(default=())
    budget_ms: float | None = None  # the time budget a guard planned this tick for
    guard_active: bool = False  # a guard removed work from this tick
    pause: bool = False  # a stepped-cost prefill tick among interactive ones (LatencyGuard)

    @property
    def n_decode(self) -> int:
        return sum(1 for item in self.items if item.phase is Phase.DECODE)

    @property
    def n_tokens(self) -> int:
        return sum(item.n_tokens for item in self.items)

    @property
    def empty(self) -> bool:
        return not self.items


def views_by_seq(state: SchedulerState) -> dict[int, SessionView]:
    return {s.seq_id: s for s in state.sessions}


def item_shape(item: BatchItem, view: SessionView) -> TickShape:
    """One item's features for the tick-time model (its attention cost from its n_past)."""
    kv = item.n_tokens * (view.n_past + (item.n_tokens + 1) / 2) / 1000.0
    if item.phase is Phase.DECODE:  # a drafted token has its logits row, as a decode
        return TickShape(item.n_tokens, 0, kv)
    return TickShape(0, item.n_tokens, kv)


def plan_shape(items: tuple[BatchItem, ...], views: dict[int, SessionView]) -> TickShape:
    """The features of a batch for the tick-time model."""
    shape = TickShape(0, 0, 0.0)
    for item in items:
        shape = shape + item_shape(item, views[item.seq_id])
    return shape
