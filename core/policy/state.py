"""The policy's data contract: what the engine shows the policy, and what it gets back.

Like vLLM's SchedulerOutput, a Plan is the whole contract between scheduler and executor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol


class Phase(Enum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True, slots=True)
class SessionView:
    """One running sequence as the policy sees it (times in ns, monotonic clock)."""

    seq_id: int
    phase: Phase
    qos: str  # "interactive" | "background"
    prompt_len: int
    n_past: int  # tokens already in the KV cache
    pending_prefill: int  # prompt tokens not yet in the KV cache
    generated: int
    arrival_ns: int
    first_token_ns: int | None = None
    last_token_ns: int | None = None


@dataclass(frozen=True, slots=True)
class EngineStats:
    decode_ms_ewma: float = 0.0  # wall time of any tick, smoothed
    base_tick_ms_ewma: float = 0.0  # wall time of ticks without prefill, smoothed
    prefill_ms_per_token_ewma: float = 0.0  # extra ms a prefill token adds to a tick, smoothed
    last_tick_tokens: int = 0
    last_decode_failed: bool = False  # the previous llama_decode found no KV slot


@dataclass(frozen=True, slots=True)
class SchedulerState:
    sessions: tuple[SessionView, ...]
    stats: EngineStats
    now_ns: int


@dataclass(frozen=True, slots=True)
class Constraints:
    n_batch: int  # the context's logical batch: tokens per llama_decode at most
    tick_budget_ms: float  # wall time one tick should stay within
    min_prefill_tokens: int = 16  # prefill chunk granted even when the budget is spent
    prefill_burst: int = 256  # tokens one session may prefill per round of the rotation
    max_prefill_tokens: int | None = None  # cap after a failed decode (no KV slot)


@dataclass(frozen=True, slots=True)
class BatchItem:
    seq_id: int
    phase: Phase
    n_tokens: int
    logits: bool  # logits wanted for the item's last token


@dataclass(frozen=True, slots=True)
class Plan:
    """One tick: items in batch order, plus sessions to park (skip) this tick."""

    items: tuple[BatchItem, ...] = ()
    parked: tuple[int, ...] = field(default=())

    @property
    def n_tokens(self) -> int:
        return sum(item.n_tokens for item in self.items)

    @property
    def empty(self) -> bool:
        return not self.items


class IBatchPolicy(Protocol):
    def schedule_tick(self, state: SchedulerState, constraints: Constraints) -> Plan: ...
