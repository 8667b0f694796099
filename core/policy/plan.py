"""The policy's data contract: each running sequence as the policy sees it, the limits it
plans within, and the Plan it returns (commands only: what to decode, whom to park).

Like vLLM's SchedulerOutput, a Plan is what the scheduler turns into the executor's batch.
It names no transformer: each one's own settings live in its module, its own remarks on a
tick travel in ``Plan.notes`` (core/policy/pipeline.py lists them).
"""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

import msgspec

from uma_serve.core.policy.cost import TickCost, TickShape

N = TypeVar("N")


class Phase(Enum):
    PREFILL = "prefill"
    DECODE = "decode"


class SessionView(msgspec.Struct, frozen=True):
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


class ModelFacts(msgspec.Struct, frozen=True):
    """What the bandwidth (ΣBMT) estimate and MoE shaping need to know about the model."""

    weights_bytes: int = 0
    kv_bytes_per_cell: int = 0  # K+V bytes one token adds to the cache, all layers
    n_expert: int = 0  # 0: dense
    n_expert_used: int = 0


class Constraints(msgspec.Struct, frozen=True):
    n_batch: int  # the context's logical batch: tokens per llama_decode at most
    tick_budget_ms: float  # baseline: wall time one tick should stay within
    min_prefill_tokens: int = 16  # prefill chunk granted even when the budget is spent
    prefill_burst: int = 256  # tokens one session may prefill per round of the rotation
    max_prefill_tokens: int | None = None  # cap after a failed decode (no KV slot)
    # the time targets: a chat turn's prompt ticks (None: up to bg_tick_ms), ticks without
    # interactive work, and the longest any session waits between progress
    slo_ttft_ms: float | None = None
    bg_tick_ms: float = 60.0
    starve_ms: float = 2000.0
    model: ModelFacts = ModelFacts()
    # the drafts the engine proposes (core/spec/): none when spec_max_draft is 0
    spec_max_draft: int = 0  # drafted tokens per stream per tick at most
    spec_max_streams: int = 2  # drafts only while at most this many streams decode
    # the tick-time model before a context has measured its own ticks (cost.py's GPU_PRIOR
    # where layers run on a GPU)
    tick_prior: TickCost = TickCost()


class BatchItem(msgspec.Struct, frozen=True):
    seq_id: int
    phase: Phase
    n_tokens: int  # a DECODE item: 1 (the pending token) + drafted tokens to verify
    logits: bool  # logits wanted for the item's last token (every token of a drafted decode)


class Plan(msgspec.Struct, frozen=True):
    """One tick: items in batch order, sessions to park (skip) this tick, the time budget it
    was planned for and whether a guard removed work, and what the transformers noted about it
    (each its own type; read back by their observe steps)."""

    items: tuple[BatchItem, ...] = ()
    parked: tuple[int, ...] = ()
    budget_ms: float | None = None  # the time budget a guard planned this tick for
    guard_active: bool = False  # a guard removed work from this tick
    notes: tuple[object, ...] = ()

    def noted(self, kind: type[N]) -> N | None:
        """The note of type ``kind``, if a transformer made one."""
        return next((n for n in self.notes if type(n) is kind), None)

    @property
    def n_decode(self) -> int:
        return sum(1 for item in self.items if item.phase is Phase.DECODE)

    @property
    def n_tokens(self) -> int:
        return sum(item.n_tokens for item in self.items)

    @property
    def empty(self) -> bool:
        return not self.items


def attended_k(n_tokens: int, n_past: int) -> float:
    """KV cells ``n_tokens`` new tokens after ``n_past`` attend over, in thousands."""
    return n_tokens * (n_past + (n_tokens + 1) / 2) / 1000.0


def item_shape(item: BatchItem, view: SessionView) -> TickShape:
    """One item's features for the tick-time model (its attention cost from its n_past)."""
    kv = attended_k(item.n_tokens, view.n_past)
    if item.phase is Phase.DECODE:  # a drafted token has its logits row, as a decode
        return TickShape(item.n_tokens, 0, kv)
    return TickShape(0, item.n_tokens, kv)


def plan_shape(items: tuple[BatchItem, ...], views: dict[int, SessionView]) -> TickShape:
    """The features of a batch for the tick-time model: the sum of its items' (item_shape),
    added up in place (a shape built and added per item: ~2% of the engine thread)."""
    decode, prefill, kv = 0, 0, 0.0
    for item in items:
        n = item.n_tokens
        kv += attended_k(n, views[item.seq_id].n_past)
        if item.phase is Phase.DECODE:
            decode += n
        else:
            prefill += n
    return TickShape(decode, prefill, kv)
