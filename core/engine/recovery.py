"""What follows from a failed tick: a pure decision, which the scheduler applies.

A decode that produced nothing (core/engine/tick.py's ``Failure``) costs as little as it can:
an aborted tick of bulk work is redone once the chat turn that stopped it is admitted; a tick
that found no KV slot is retried when finished sequences' cells were freed after it, else the
prefix cache makes room, else the prefill shrinks, and only a batch of decode tokens alone
that does not fit ends its longest sequence; any other error fails the tick's requests.
"""

from __future__ import annotations

from dataclasses import dataclass

from uma_serve.core.engine.tick import Failure


@dataclass(frozen=True, slots=True)
class Aborted:
    """A chat turn arrived during a tick of bulk work: admit it, redo the work later."""


@dataclass(frozen=True, slots=True)
class Retry:
    """No KV slot, but finished sequences' cells were freed after the decode: run it again."""


@dataclass(frozen=True, slots=True)
class EvictCache:
    """No KV slot: drop cached prefixes (the never-reused ones first) for the running work."""


@dataclass(frozen=True, slots=True)
class ShrinkPrefill:
    """No KV slot with the cache empty: cap the next ticks' prefill at ``n`` tokens (doubled
    back after each tick that fits)."""

    n: int


@dataclass(frozen=True, slots=True)
class FailLongest:
    """Decode tokens alone do not fit: the longest sequence gives way (E_RUNTIME)."""


@dataclass(frozen=True, slots=True)
class FailBatch:
    """A hard llama_decode error: the tick's requests end with E_RUNTIME."""

    rc: int


Decision = Aborted | Retry | EvictCache | ShrinkPrefill | FailLongest | FailBatch


def decide(failure: Failure, rc: int, n_prefill: int, cache_evictable: bool) -> Decision:
    """The decision for a failed tick that carried ``n_prefill`` prompt tokens, with
    ``cache_evictable``: the prefix cache holds entries it may drop."""
    if failure is Failure.ABORTED:
        return Aborted()
    if failure is Failure.RETRY:
        return Retry()
    if failure is Failure.NO_SLOT:
        if cache_evictable:
            return EvictCache()
        if n_prefill > 1:
            return ShrinkPrefill(max(n_prefill // 2, 1))
        return FailLongest()
    return FailBatch(rc)
