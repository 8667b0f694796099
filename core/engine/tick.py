"""What the scheduler hands the executor for one tick, and what comes back.

batch = scheduler.schedule()      # a Batch: the policy's Plan over the running sequences
out = executor.run(batch)         # a TickResult: one llama_decode, the rows sampled
events = scheduler.postprocess(batch, out)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from uma_serve.core import protocol as p
from uma_serve.core.engine.sequence import Sequence
from uma_serve.core.policy import Plan, SchedulerState

Outgoing = tuple[int, p.Event]  # (connection id, event)


@dataclass(frozen=True, slots=True)
class Batch:
    """One tick's work: the plan, the state it was planned from, and each item's sequence."""

    plan: Plan
    state: SchedulerState
    seqs: tuple[Sequence, ...]  # aligned with plan.items
    abortable: bool  # bulk work only: a chat turn's arrival may stop its decode

    @property
    def empty(self) -> bool:
        return self.plan.empty


class Failure(Enum):
    """Why a tick's llama_decode produced nothing (its cache writes are undone)."""

    ABORTED = "aborted"  # a chat turn arrived during a tick of bulk work
    RETRY = "retry"  # no KV slot, but finished sequences' cells were freed after it
    NO_SLOT = "no slot"  # no KV slot for the batch
    ERROR = "error"  # any other llama_decode error


@dataclass(frozen=True, slots=True)
class Sampled:
    """One item's sampled tokens: none (a prefill chunk without logits), one, or for a
    decode with drafts the tokens drawn row by row while they agreed with the drafts."""

    tokens: tuple[int, ...] = ()
    logprobs: tuple[p.Logprobs | None, ...] = ()


@dataclass(frozen=True, slots=True)
class TickResult:
    rc: int  # llama_decode's return code
    t0: float  # perf_counter at the decode's launch
    ms: float  # the tick's own time (launch to device done, less the work done meanwhile)
    failure: Failure | None = None
    sampled: tuple[Sampled, ...] = ()  # aligned with the plan's items (empty on failure)
