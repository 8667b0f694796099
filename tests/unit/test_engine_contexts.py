"""Several llama.cpp contexts of one model (the engine's shards), on fake runtimes: each
context runs only its own requests and they are stepped in turn, a new request goes where
there is room (chat turns spread while no context holds bulk work, which joins the busier
context), a conversation's next turn to the context holding its history, a cancel finds
its request wherever it runs, and the state gauges add up every context's."""

from __future__ import annotations

import threading

import msgspec
from test_engine_fake_runtime import FakeRuntime

from uma_serve.core import protocol as p
from uma_serve.core.engine import Engine, Submission
from uma_serve.core.policy import BaselinePolicy, Constraints


class Logged(FakeRuntime):
    """Logs its decodes (name, sequence ids) in a list it shares with its sibling."""

    def __init__(self, name: str, log: list, n_seq: int = 2) -> None:
        super().__init__(n_seq)
        self.name, self.log = name, log
        self.n_ctx_per_seq = 1 << 20  # no request ends by the context's length here
        self.on_thread: list[bool] = []  # each launch: to the launch thread or not

    def launch(self, spans, on_thread: bool = False) -> list[int]:
        self.on_thread.append(on_thread)
        return super().launch(spans, on_thread)

    def decode(self, spans):
        self.log.append((self.name, tuple(s.seq_id for s in spans)))
        return super().decode(spans)


def two_contexts(events: list, done: threading.Event, finals: int, n_seq: int = 2, **kw):
    log: list = []
    rts = [Logged("a", log, n_seq), Logged("b", log, n_seq)]

    def sink(batch):
        events.extend(batch)
        if sum(isinstance(e, p.EosEvent | p.ErrorEvent) for _, e in events) >= finals:
            done.set()

    c = Constraints(n_batch=64, tick_budget_ms=50.0)
    pols = [BaselinePolicy(), BaselinePolicy()]
    return Engine(rts, pols, c, sink, seed=1, overlap=True, **kw), log


def gen(rid: str, n: int = 6) -> p.Generate:
    return p.Generate(id=rid, prompt="x", max_tokens=n, temperature=0.0, ignore_eos=True)


def test_each_context_decodes_only_its_own_requests_and_they_step_in_turn() -> None:
    events: list = []
    done = threading.Event()
    engine, log = two_contexts(events, done, 4)
    for i in range(4):
        engine.submit(Submission((1, f"r{i}"), gen(f"r{i}"), [1, 2, 3], i))
    engine.start()
    assert done.wait(10)
    engine.stop("test over")
    engine.join(5)
    toks = {e.id: e.token_id for _, e in events if isinstance(e, p.TokenEvent)}
    assert len(toks) == 4  # every request ran
    ends = [e for _, e in events if isinstance(e, p.EosEvent)]
    assert sorted(e.reason for e in ends) == ["length"] * 4
    assert all(e.usage.completion_tokens == 6 for e in ends)
    by_ctx = {name: {i for n, ids in log if n == name for i in ids} for name in "ab"}
    assert by_ctx["a"] == {0, 1} and by_ctx["b"] == {0, 1}  # two requests in each
    names = [n for n, _ in log]
    assert any(names[i : i + 2] == ["a", "b"] for i in range(len(names) - 1))  # in turn


def run_requests(n: int) -> Engine:
    events: list = []
    done = threading.Event()
    engine, _ = two_contexts(events, done, n)
    for i in range(n):
        engine.submit(Submission((1, f"r{i}"), gen(f"r{i}"), [1, 2, 3], i))
    engine.start()
    assert done.wait(10)
    engine.stop("test over")
    engine.join(5)
    return engine


def test_a_launch_goes_to_the_launch_thread_only_while_another_context_works() -> None:
    """The handoff costs a lone context's tick ~0.1 ms and there is nothing to overlap."""
    lone = [sh.runtime.on_thread for sh in run_requests(1).shards]
    assert lone[0] and not any(lone[0]) and not lone[1]
    both = [sh.runtime.on_thread for sh in run_requests(4).shards]
    assert any(both[0]) and any(both[1])


def test_chat_turns_spread_until_bulk_work_which_joins_the_streams() -> None:
    """Chat turns go to the least busy context while none holds bulk work; bulk work goes to
    the busier context (with its streams), and once it is there chat turns join it."""
    events: list = []
    engine, _ = two_contexts(events, threading.Event(), 3, n_seq=3)
    a, b = (sh.scheduler for sh in engine.shards)

    def route(rid: str, prompt: list[int], **kw) -> object:
        sub = Submission((1, rid), msgspec.structs.replace(gen(rid), **kw), prompt, 0)
        return engine._route(sub), sub

    b.add(route("x0", [1, 2, 3])[1])
    b.admit()
    assert route("n", [4, 5, 6])[0] is a  # room in both, no bulk: the least busy
    where, bg = route("bg", [7, 8], qos="background")
    assert where is b  # bulk: the busier one, with the stream
    b.add(bg)
    b.admit()
    assert b.holds_bulk() and not a.holds_bulk()
    assert route("m", [9])[0] is b  # bulk there: a chat turn joins it
    b.add(route("m", [9])[1])
    b.admit()
    assert route("k", [10])[0] is a  # b is full
    assert engine.metrics.active_sessions == 3  # every context's sequences


def test_with_a_fill_chat_turns_fill_a_context_to_it_then_spread() -> None:
    """A bigger model's contexts (umad: a file over 2 GiB) fill one after another up to
    ``fill`` requests each (a split small batch runs its matmuls twice), then the streams
    spread (each context's host work overlaps the other's tick)."""
    engine, _ = two_contexts([], threading.Event(), 1, n_seq=4, fill=2)
    a, b = (sh.scheduler for sh in engine.shards)
    b.add(Submission((1, "x0"), gen("x0"), [1, 2, 3], 0))
    b.admit()
    order = []
    for i in range(1, 7):
        sub = Submission((1, f"n{i}"), gen(f"n{i}"), [4, i], i)
        where = engine._route(sub)
        order.append("a" if where is a else "b")
        where.add(sub)
        where.admit()
    # b to 2, then a to 2, then the least busy in turn, until both are full
    assert order == ["b", "a", "a", "a", "b", "a"], order


def test_a_cancel_reaches_the_request_in_whichever_context_runs_it() -> None:
    events: list = []
    done = threading.Event()
    engine, _ = two_contexts(events, done, 2, n_seq=1)  # one request in each context
    engine.submit(Submission((1, "long0"), gen("long0", 1_000_000), [1, 2, 3], 0))
    engine.submit(Submission((1, "long1"), gen("long1", 1_000_000), [1, 2, 3], 1))
    engine.start()
    for rid in ("long1", "long0"):
        engine.cancel((1, rid))
    assert done.wait(10)
    engine.stop("test over")
    engine.join(5)
    finals = {e.id: e.reason for _, e in events if isinstance(e, p.EosEvent)}
    assert finals == {"long0": "cancelled", "long1": "cancelled"}
    assert {len(sh.scheduler.running) for sh in engine.shards} == {0}


def test_a_conversations_next_turn_goes_to_the_context_holding_its_history() -> None:
    """Where both have room, the prompt's cached prefix outranks the load."""
    events: list = []
    engine, _ = two_contexts(events, threading.Event(), 1, n_seq=3)
    a, b = (sh.scheduler for sh in engine.shards)
    for i in range(2):  # a runs more than b
        a.add(Submission((1, f"x{i}"), gen(f"x{i}"), [1, 2, 3], i))
        a.admit()
    turn = Submission((1, "t"), gen("t"), list(range(40)), 5)
    assert engine._route(turn) is b  # the least busy
    a.cached_estimate = lambda hashes: 32  # type: ignore[method-assign]  # its history
    assert engine._route(turn) is a


def test_background_work_goes_where_an_id_beyond_the_reserved_ones_is_free() -> None:
    """A context whose only free id is kept for chat turns has no room for background work:
    it goes to the other, where it can start at once, while a chat turn may take that id."""
    events: list = []
    engine, _ = two_contexts(events, threading.Event(), 1, n_seq=2, reserved_interactive=1)
    a, b = (sh.scheduler for sh in engine.shards)
    a.add(Submission((1, "x"), gen("x"), [1, 2, 3], 0))
    a.admit()  # a: one id left, the reserved one
    bg = msgspec.structs.replace(gen("bg"), qos="background")
    assert engine._route(Submission((1, "bg"), bg, [4, 5, 6], 1)) is b
    for i in range(2):  # b full
        b.add(Submission((1, f"y{i}"), gen(f"y{i}"), [1, 2], 2 + i))
        b.admit()
    assert engine._route(Submission((1, "c"), gen("c"), [7, 8], 4)) is a  # the reserved id
