"""What a failed tick costs (core/engine/recovery.py): each branch of the pure decision, and
the scheduler applying one on a fake runtime whose KV cache is too small."""

from __future__ import annotations

import pytest
from test_engine_fake_runtime import EndsSink, TightRuntime

from uma_serve.core import protocol as p
from uma_serve.core.engine import Engine, Submission
from uma_serve.core.engine.recovery import (
    Aborted,
    EvictCache,
    FailBatch,
    FailLongest,
    Retry,
    ShrinkPrefill,
    decide,
)
from uma_serve.core.engine.tick import Failure
from uma_serve.core.policy import BaselinePolicy, Constraints


@pytest.mark.parametrize("evictable", [False, True])
@pytest.mark.parametrize("n_prefill", [0, 1, 300])
def test_an_aborted_tick_is_redone_and_a_freed_one_retried_whatever_else_holds(
    n_prefill: int, evictable: bool
) -> None:
    assert decide(Failure.ABORTED, 2, n_prefill, evictable) == Aborted()
    assert decide(Failure.RETRY, 1, n_prefill, evictable) == Retry()


def test_no_slot_evicts_the_prefix_cache_first() -> None:
    assert decide(Failure.NO_SLOT, 1, 300, cache_evictable=True) == EvictCache()
    assert decide(Failure.NO_SLOT, 1, 0, cache_evictable=True) == EvictCache()


def test_no_slot_with_nothing_to_evict_halves_the_prefill() -> None:
    assert decide(Failure.NO_SLOT, 1, 300, cache_evictable=False) == ShrinkPrefill(150)
    assert decide(Failure.NO_SLOT, 1, 3, cache_evictable=False) == ShrinkPrefill(1)
    assert decide(Failure.NO_SLOT, 1, 2, cache_evictable=False) == ShrinkPrefill(1)


def test_no_slot_for_decode_tokens_alone_fails_the_longest() -> None:
    assert decide(Failure.NO_SLOT, 1, 1, cache_evictable=False) == FailLongest()
    assert decide(Failure.NO_SLOT, 1, 0, cache_evictable=False) == FailLongest()


@pytest.mark.parametrize("rc", [-1, -3, 5])
def test_a_hard_error_fails_the_batch_with_its_code(rc: int) -> None:
    assert decide(Failure.ERROR, rc, 10, cache_evictable=True) == FailBatch(rc)


def test_the_scheduler_ends_the_longest_sequence_when_decode_alone_does_not_fit() -> None:
    """Two prompts of 3 fill 6 of 7 cells; their two decode tokens do not fit: one request
    ends with E_RUNTIME, the other completes, and nothing else fails."""
    sink = EndsSink(2)
    events, done = sink.events, sink.done
    runtime = TightRuntime(capacity=7)
    engine = Engine(runtime, BaselinePolicy(), Constraints(n_batch=64, tick_budget_ms=50.0), sink)
    for rid in ("a", "b"):
        r = p.Generate(id=rid, prompt="x", max_tokens=3, ignore_eos=True)
        engine.submit(Submission((1, rid), r, [1, 2, 3], 0))
    engine.start()
    assert done.wait(10), runtime.log
    engine.stop("test over")
    engine.join(5)
    finals = [e for _, e in events if isinstance(e, p.EosEvent | p.ErrorEvent)]
    errors = [e for e in finals if isinstance(e, p.ErrorEvent)]
    assert len(errors) == 1 and "KV cache full" in errors[0].message, finals
    [ok] = [e for e in finals if isinstance(e, p.EosEvent)]
    assert ok.reason == "length" and ok.usage.completion_tokens == 3
    assert engine.metrics.decode_failures_total == 1
