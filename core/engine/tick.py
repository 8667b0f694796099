"""What the scheduler hands the executor for one tick, and what comes back.

batch = scheduler.batch(scheduler.plan())  # a Batch: the plan, its spans and sampler rows
launched = executor.launch(batch)          # one llama_decode, launched
...                                        # host work while the device computes
result = executor.collect(launched, …)     # a TickResult: the device done, the rows sampled
events = scheduler.advance(batch, result)

The Batch is the executor's whole input: it reads no sequence and calls nothing back.
"""

from __future__ import annotations

from enum import Enum

import msgspec

from uma_serve.core import protocol as p
from uma_serve.core.policy import Plan, SchedulerState
from uma_serve.core.runtime import Span
from uma_serve.core.sampling import SamplerState

Outgoing = tuple[int, p.Event]  # (connection id, event)


class Draw(msgspec.Struct, frozen=True):
    """How to sample one item's logits: its session's sampler, the top logprobs its request
    wants (None: none) and, for a decode with drafts, the drafted tokens to verify row by row."""

    sampler: SamplerState
    logprobs: int | None = None
    drafts: tuple[int, ...] = ()


class Batch(msgspec.Struct, frozen=True):
    """One tick's work: the plan and the state it was planned from, and for each of the plan's
    items the tokens it decodes and how its logits are sampled (None: no logits)."""

    plan: Plan
    state: SchedulerState
    spans: tuple[Span, ...]  # aligned with plan.items
    draws: tuple[Draw | None, ...]  # aligned with plan.items
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


class Sampled(msgspec.Struct, frozen=True):
    """One item's sampled tokens: none (a prefill chunk without logits), one, or for a
    decode with drafts the tokens drawn row by row while they agreed with the drafts."""

    tokens: tuple[int, ...] = ()
    logprobs: tuple[p.Logprobs | None, ...] = ()


class Launched(msgspec.Struct, frozen=True):
    """A decode on its way: the executor's handle between launch and collect."""

    batch: Batch
    rows: tuple[int, ...]  # each span's first logits row (-1: none)
    t0: float  # perf_counter at the launch


class TickResult(msgspec.Struct, frozen=True):
    rc: int  # llama_decode's return code
    t0: float  # perf_counter at the decode's launch
    ms: float  # the tick's own time (launch to device done, less the host work meanwhile)
    failure: Failure | None = None
    sampled: tuple[Sampled, ...] = ()  # aligned with the plan's items (empty on failure)
    sample_ms: float = 0.0  # sampling the rows, after the device was done
    overlap_ms: float = 0.0  # host work done between launch and collect (the device computing)
    # llama.cpp reused the previous decode's graph (a GPU replays its CUDA graph only then)
    graph_reused: bool = True
