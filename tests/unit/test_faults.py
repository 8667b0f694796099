"""The decode fault (core/faults.py) as a wrapper around the runtime: the engine runs on it
unchanged, and only the request whose prompt holds the marker fails (the real daemon's side
is tests/integration/test_core_faults.py)."""

from __future__ import annotations

from test_engine_fake_runtime import EndsSink, FakeRuntime

from uma_serve.core import protocol as p
from uma_serve.core.engine import Engine, Submission
from uma_serve.core.faults import DECODE_FAIL_RC, FailingDecode, Faults
from uma_serve.core.policy import BaselinePolicy, Constraints
from uma_serve.core.runtime import Span
from uma_serve.core.runtime.api import RuntimeApi

MARKER = "<2><3>"  # the fake runtime's pieces of tokens 2 and 3


def test_no_decode_fault_leaves_the_runtime_as_it_is() -> None:
    rt = FakeRuntime()
    assert Faults().wrap(rt) is rt
    wrapped = Faults(decode_fail=MARKER).wrap(rt)
    assert isinstance(wrapped, FailingDecode) and isinstance(wrapped, RuntimeApi)
    assert wrapped.n_ctx == rt.n_ctx and wrapped.piece(5) == b"<5>"


def test_the_marker_fails_a_decode_even_across_two_chunks_until_trimmed() -> None:
    rt = FailingDecode(FakeRuntime(), MARKER)  # type: ignore[arg-type]
    assert rt.decode([Span(0, 0, [1, 2], False), Span(1, 0, [9], True)])[0] == 0
    rc, rows = rt.decode([Span(0, 2, [3, 4], True)])  # the marker's second half
    assert (rc, rows) == (DECODE_FAIL_RC, [-1])
    rt.seq_trim(0, 2)  # the executor undoes the failed decode
    assert rt.decode([Span(0, 2, [5], True)])[0] == 0
    rt.seq_copy(0, 2, 2)  # a prefix copied holds what its source held
    assert rt.decode([Span(2, 2, [3], True)])[0] == DECODE_FAIL_RC
    rt.seq_clear(2)
    assert rt.decode([Span(2, 0, [3], True)])[0] == 0


def test_only_the_request_with_the_marker_fails_and_the_others_are_served() -> None:
    sink = EndsSink(2)
    events, done = sink.events, sink.done
    # one sequence: a failed decode fails every request of its batch, so one at a time
    runtime = Faults(decode_fail=MARKER).wrap(FakeRuntime(n_seq=1))
    c = Constraints(n_batch=64, tick_budget_ms=50.0)
    engine = Engine(runtime, BaselinePolicy(), c, sink, seed=1)
    bad = p.Generate(id="bad", prompt="x", max_tokens=4, ignore_eos=True)
    good = p.Generate(id="good", prompt="x", max_tokens=4, ignore_eos=True)
    engine.submit(Submission((1, "bad"), bad, [1, 2, 3], 0))
    engine.submit(Submission((1, "good"), good, [7, 8, 9], 1))
    engine.start()
    assert done.wait(10), events
    engine.stop("test over")
    engine.join(5)
    finals = {e.id: e for _, e in events if isinstance(e, p.EosEvent | p.ErrorEvent)}
    assert isinstance(finals["bad"], p.ErrorEvent) and finals["bad"].code == p.E_RUNTIME
    assert "llama_decode failed (rc=-1)" in finals["bad"].message
    assert isinstance(finals["good"], p.EosEvent) and finals["good"].usage.completion_tokens == 4
