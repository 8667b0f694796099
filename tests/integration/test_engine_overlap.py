"""The engine with its tick left in flight between steps (``overlap``, how umad runs on a GPU)
on the real model, on the CPU: the same greedy text as the engine that collects each tick in
its own step, and a stop string, a cancel and a length end among concurrent requests; the
same with each llama_decode on the runtime's launch thread (as on a GPU), whose context
calls wait for the decode in flight."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest

from uma_serve.core import protocol as p
from uma_serve.core.config import default_model_path
from uma_serve.core.engine import Engine, Submission
from uma_serve.core.policy import BaselinePolicy, Constraints
from uma_serve.core.runtime import Runtime, RuntimeParams, Span


@pytest.fixture(scope="module")
def runtime():
    rt = Runtime(RuntimeParams(default_model_path(), n_ctx=4096, n_seq=4))
    yield rt
    rt.close()


@pytest.fixture(scope="module")
def threaded():
    """Two contexts of the model, each with a launch thread (on the CPU too, where umad
    launches on its own thread only): a context's launch goes there while the other works."""
    params = RuntimeParams(default_model_path(), n_ctx=2048, n_seq=2, launch_thread=True)
    first = Runtime(params)
    second = Runtime(params, model_of=first)
    yield [first, second]
    second.close()
    first.close()


def run(
    rt: Runtime | list[Runtime],
    overlap: bool,
    requests: list[p.Generate],
    cancel_after: str = "",
    compute_nice: int = 0,
) -> dict:
    """Each request's (text, final event); ``cancel_after``: the request cancelled once its
    third token is out."""
    texts: dict[str, list[str]] = {r.id: [] for r in requests}
    finals: dict[str, p.Event] = {}
    done = threading.Event()
    engine: Engine

    def sink(batch):
        for _, e in batch:
            if isinstance(e, p.TokenEvent):
                texts[e.id].append(e.text)
                if e.id == cancel_after and len(texts[e.id]) == 3:
                    engine.cancel((1, e.id))
            elif isinstance(e, p.EosEvent | p.ErrorEvent):
                finals[e.id] = e
        if len(finals) == len(requests):
            done.set()

    c = Constraints(n_batch=256, tick_budget_ms=1000.0)
    rts = rt if isinstance(rt, list) else [rt]
    policies = [BaselinePolicy() for _ in rts]
    engine = Engine(rts, policies, c, sink, seed=1, overlap=overlap, compute_nice=compute_nice)
    for i, r in enumerate(requests):
        engine.submit(Submission((1, r.id), r, rts[0].tokenize(r.prompt), i))
    engine.start()
    assert done.wait(120), finals
    engine.stop("test over")
    engine.join(10)
    return {r.id: ("".join(texts[r.id]), finals[r.id]) for r in requests}


def greedy(rid: str, prompt: str, **kw) -> p.Generate:
    kw.setdefault("max_tokens", 24)
    return p.Generate(id=rid, prompt=prompt, temperature=0.0, stream=True, **kw)


def test_a_tick_in_flight_gives_the_same_greedy_text(runtime) -> None:
    req = greedy("a", "The three laws of motion are")
    assert run(runtime, True, [req])["a"][0] == run(runtime, False, [req])["a"][0]


def test_launch_threads_give_the_same_greedy_text(runtime, threaded) -> None:
    """Three requests: two in the first context, one in the second, each context's decodes
    launched on its thread while the other's tick is in flight."""
    reqs = [
        greedy("a", "The three laws of motion are"),
        greedy("b", "Once upon a time, there"),
        greedy("c", "def fibonacci(n):"),
    ]
    got = run(threaded, True, reqs)
    assert sum(rt._launcher.launches for rt in threaded) > 0  # it ran there
    want = run(runtime, False, reqs)
    assert {k: v[0] for k, v in got.items()} == {k: v[0] for k, v in want.items()}


def test_a_context_call_waits_for_the_launch_in_flight(runtime, threaded) -> None:
    """The cache, the logits and the rc read right after a launch on the thread are those
    after its llama_decode (the CPU computes the prompt for milliseconds meanwhile)."""
    threaded = threaded[1]  # a context sharing the other's model
    tokens = runtime.tokenize("The lighthouse keeper logs the weather every morning. " * 8)
    for rt in (runtime, threaded):
        rt.clear_all()
    rc, [row] = runtime.decode([Span(0, 0, tokens, True)])
    assert rc == 0
    want = runtime.logits_row(row).copy()
    [row] = threaded.launch([Span(0, 0, tokens, True)], on_thread=True)
    assert threaded.seq_pos_max(0) == len(tokens) - 1
    assert (threaded.logits_row(row) == want).all()
    assert threaded.synchronize() == 0
    threaded.abort()  # an aborted decode's rc comes through synchronize
    threaded.launch([Span(1, 0, tokens, True)], on_thread=True)
    assert threaded.synchronize() == 2
    threaded.clear_abort()
    assert threaded.seq_pos_max(1) == -1  # llama.cpp took its cells back
    for rt in (runtime, threaded):
        rt.clear_all()


def test_a_decodes_graph_reuse_is_counted_before_its_synchronize(runtime, threaded) -> None:
    """The executor reads llama.cpp's graph-reuse count while the device computes: the count
    after a launch returns, on the launch thread too, is already the decode's."""
    for rt, on_thread in ((runtime, False), (threaded[1], True)):
        rt.clear_all()
        rt.launch([Span(0, 0, [5, 6, 7], True)], on_thread)
        assert rt.synchronize() == 0
        counts = []
        for pos in (3, 4, 5):  # a token each: the graph of the one before
            before = rt.graph_reuses()
            rt.launch([Span(0, pos, [8], True)], on_thread)
            counts.append(rt.graph_reuses() - before)
            assert rt.synchronize() == 0
        assert counts[1:] == [1, 1], counts
        rt.clear_all()


@pytest.mark.parametrize("launch_thread", [False, True])
def test_a_tick_in_flight_ends_requests_by_stop_cancel_and_length(
    runtime, threaded, launch_thread: bool
) -> None:
    solo = run(runtime, False, [greedy("s", "Once upon a time, there", max_tokens=32)])["s"][0]
    stop = solo.split()[4]  # a word it writes: the stop string ends it there
    reqs = [
        greedy("s", "Once upon a time, there", max_tokens=32, stop=stop),
        greedy("c", "def fibonacci(n):", max_tokens=200, ignore_eos=True),
        greedy("n", "The capital of France is", max_tokens=16, ignore_eos=True),
    ]
    got = run(threaded if launch_thread else runtime, True, reqs, cancel_after="c")
    text, end = got["s"]
    assert isinstance(end, p.EosEvent) and end.reason == "stop" and stop not in text
    text, end = got["c"]
    assert isinstance(end, p.EosEvent) and end.reason == "cancelled"
    assert end.usage.completion_tokens < 200
    text, end = got["n"]
    assert isinstance(end, p.EosEvent) and end.reason == "length"
    assert end.usage.completion_tokens == 16


def conversation(overlap: bool, stop: str | None = None) -> tuple[list[p.EosEvent], str]:
    """Two turns of a chat through an engine with the prefix cache: the second re-sends the
    first's prompt and answer, submitted as the first ends (on the engine's own thread);
    ``stop``: the first turn's stop string. The final events and the whole text."""
    params = RuntimeParams(
        default_model_path(), n_ctx=4096, n_seq=2, n_seq_cache=2, swa_full=True, shadow=True
    )
    rt = Runtime(params)
    first = (
        "System: You are a helpful assistant. Answer briefly and kindly, in plain words, "
        "without lists.\nUser: Name three colours.\nAssistant:"
    )
    finals: list[p.EosEvent] = []
    texts: list[str] = []
    done = threading.Event()
    engine: Engine

    def sink(batch):
        for _, e in batch:
            if isinstance(e, p.TokenEvent):
                texts.append(e.text)
            elif isinstance(e, p.EosEvent):
                finals.append(e)
                if len(finals) == 1:  # the client re-sends the history with its next turn
                    history = first + "".join(texts) + "\nUser: And three more?\nAssistant:"
                    turn = greedy("t2", history, max_tokens=12)
                    engine.submit(Submission((1, "t2"), turn, rt.tokenize(history), 1))
                else:
                    done.set()

    c = Constraints(n_batch=256, tick_budget_ms=1000.0)
    engine = Engine(rt, BaselinePolicy(), c, sink, seed=1, prefix_cache_tokens=2048,
                    prefix_cache_slots=2, overlap=overlap)  # fmt: skip
    turn = greedy("t1", first, max_tokens=12, stop=stop)
    engine.submit(Submission((1, "t1"), turn, rt.tokenize(first), 0))
    engine.start()
    try:
        assert done.wait(120), finals
    finally:
        engine.stop("test over")
        engine.join(10)
        rt.close()
    return finals, "".join(texts)


@pytest.mark.parametrize("stop", [None, "User"])
def test_a_conversation_turn_reuses_its_history_with_a_tick_in_flight(stop: str | None) -> None:
    """The next turn finds the first turn's prompt and answer in the prefix cache, which the
    first stored while later ticks were in flight, and answers as without overlap; also when
    a stop string ended the first turn (found while the next tick computed with its token,
    which the stored KV then holds)."""
    (got, got_text), (want, want_text) = conversation(True, stop), conversation(False, stop)
    assert got[0].reason == ("stop" if stop else "length")
    assert got[1].usage.cached_tokens > got[0].usage.prompt_tokens
    assert got[1].usage.cached_tokens == want[1].usage.cached_tokens
    assert [e.usage.completion_tokens for e in got] == [e.usage.completion_tokens for e in want]
    assert got_text == want_text


def test_a_launch_thread_takes_the_engine_threads_niceness() -> None:
    """A context's launch thread (native: launch.c) starts at its first launch, from the
    engine thread, so it runs at the compute threads' raised nice value (core/engine/nice.py)
    as the Python thread it replaced did."""
    params = RuntimeParams(default_model_path(), n_ctx=2048, n_seq=2, launch_thread=True)
    first = Runtime(params)
    second = Runtime(params, model_of=first)
    others = set(_launch_threads())  # other tests' runtimes' threads
    ours: dict[int, int] = {}
    try:
        assert set(_launch_threads()) == others  # none before a launch
        reqs = [greedy("a", "The three laws of motion are"), greedy("b", "Once upon a time,")]
        run([first, second], True, reqs, compute_nice=3)
        raised = min(os.getpriority(os.PRIO_PROCESS, 0) + 3, 19)  # 19: the most nice there is
        ours = {tid: nice for tid, nice in _launch_threads().items() if tid not in others}
        assert ours and set(ours.values()) == {raised}
    finally:
        second.close()
        first.close()
    assert not set(_launch_threads()) & set(ours)  # they end with their runtimes


def _launch_threads() -> dict[int, int]:
    """This process's launch threads (by their name): thread id -> nice value."""
    found = {}
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            if (task / "comm").read_text().strip() == "uma-launch":
                found[int(task.name)] = os.getpriority(os.PRIO_PROCESS, int(task.name))
    return found
