"""The real model through a real umad: streaming, concurrency, cancellation, determinism."""

from __future__ import annotations

import asyncio
import time

import pytest

from uma_serve.clients import AsyncUmaClient
from uma_serve.core import protocol as p

from .helpers import gen, raw_socket, read_event, start_daemon, wait_idle


def test_single_stream(umad) -> None:
    with umad.client() as c:
        events = list(c.stream(gen("The capital of France is", max_tokens=12, ignore_eos=True)))
    tokens = [e for e in events if isinstance(e, p.TokenEvent)]
    eos = events[-1]
    assert isinstance(eos, p.EosEvent) and eos.reason == "length"
    assert len(tokens) == 12 == eos.usage.completion_tokens
    assert eos.usage.prompt_tokens > 3
    assert "".join(t.text for t in tokens).strip()
    assert eos.timings.ttft_ms is not None and eos.timings.e2e_ms >= eos.timings.ttft_ms


def test_non_stream_returns_one_frame(umad) -> None:
    with umad.client() as c:
        events = list(c.stream(gen("One, two, three,", max_tokens=6, stream=False)))
    assert len(events) == 1
    done = events[0]
    assert isinstance(done, p.CompletionEvent) and done.text
    assert done.usage.completion_tokens <= 6


def test_greedy_output_is_identical_when_run_twice(fresh_tmp) -> None:
    """Same request alone twice: same text. With the prefix cache off: a cache hit changes the
    batch layout of the prompt, and llama.cpp's numerics then can flip near-tie greedy tokens
    (docs/MEMORY.md)."""
    daemon = start_daemon(fresh_tmp, "--n-ctx", "2048", "--prefix-cache-tokens", "0")
    req = dict(max_tokens=24, temperature=0.0, ignore_eos=True)
    seeded = dict(max_tokens=16, temperature=0.9, top_k=40, seed=7, stream=False)
    try:
        with daemon.client() as c:
            a = c.complete(gen("List three colours:", stream=False, **req))
            b = c.complete(gen("List three colours:", stream=False, **req))
            s1 = c.complete(gen("Once upon a time", **seeded))
            s2 = c.complete(gen("Once upon a time", **seeded))
    finally:
        daemon.stop()
    assert a.text == b.text and a.usage.completion_tokens == 24
    assert s1.text == s2.text  # same seed, same request: same sample


def test_chat_messages_use_the_template(umad) -> None:
    msgs = [p.Message("system", "Answer briefly."), p.Message("user", "Say hi.")]
    with umad.client() as c:
        done = c.complete(p.Generate(id="chat", messages=msgs, max_tokens=8, stream=False))
        info = c.info()
    assert info.chat_template is True
    assert done.usage.prompt_tokens > 8  # turn markers and the system text were rendered


def test_stop_string_ends_generation_without_leaking(umad) -> None:
    with umad.client() as c:
        free = c.complete(gen("1, 2, 3, 4,", max_tokens=16, stream=False, ignore_eos=True))
        assert ", 7" in free.text, free.text
        stopped = c.complete(gen("1, 2, 3, 4,", max_tokens=16, stream=False, stop=[", 7"]))
    assert stopped.reason == "stop"
    assert stopped.text == free.text[: free.text.index(", 7")]


def test_four_sessions_short_ones_finish_while_long_one_runs(umad) -> None:
    async def run() -> tuple[list[str], list[float]]:
        client = await AsyncUmaClient.connect(umad.socket)
        order: list[str] = []
        long_token_times: list[float] = []
        loop = asyncio.get_running_loop()

        async def one(name: str, max_tokens: int) -> None:
            req = gen(f"Tell me about {name}.", max_tokens=max_tokens, ignore_eos=True)
            async for ev in client.stream(req):
                if name == "long" and isinstance(ev, p.TokenEvent):
                    long_token_times.append(loop.time())
            order.append(name)

        await asyncio.gather(one("long", 120), one("a", 8), one("b", 8), one("c", 8))
        await client.close()
        return order, long_token_times

    order, long_times = asyncio.run(run())
    assert order[-1] == "long" and sorted(order[:3]) == ["a", "b", "c"]
    assert len(long_times) == 120


def test_cancel_and_disconnect_free_sequences(umad) -> None:
    async def run() -> None:
        client = await AsyncUmaClient.connect(umad.socket)
        reqs = [gen(f"Story {i}:", max_tokens=400, ignore_eos=True) for i in range(4)]
        streams = [client.stream(r) for r in reqs]
        for s in streams:  # each has produced a token: all four sequences are busy
            assert isinstance(await anext(s), p.TokenEvent)
        await client.cancel(reqs[0].id)
        final = [ev async for ev in streams[0]][-1]
        assert isinstance(final, p.EosEvent) and final.reason == "cancelled"
        await streams[1].aclose()  # leaving a stream early cancels it too
        await client.close()  # the other two: the connection goes away

    asyncio.run(run())
    wait_idle(umad)

    async def again() -> list[p.Event]:  # full concurrency is available again
        client = await AsyncUmaClient.connect(umad.socket)
        done = await asyncio.gather(
            *(client.complete(gen(f"Q{i}", max_tokens=4)) for i in range(4))
        )
        await client.close()
        return list(done)

    assert all(isinstance(e, p.EosEvent) for e in asyncio.run(again()))
    m = wait_idle(umad)
    assert m["kv_cells_used"] == 0 and m["requests_total"]["cancelled"] >= 4


def test_raw_disconnect_mid_stream_frees_sequence(umad) -> None:
    s = raw_socket(umad.socket)
    s.sendall(p.encode(gen("Count slowly:", max_tokens=400, ignore_eos=True)))
    for _ in range(3):
        assert isinstance(read_event(s), p.TokenEvent)
    s.close()
    assert wait_idle(umad)["kv_cells_used"] == 0


def test_many_requests_on_one_connection(umad) -> None:
    async def run() -> list[p.Event]:
        client = await AsyncUmaClient.connect(umad.socket)
        reqs = [gen(f"Item {i}", max_tokens=3) for i in range(10)]
        done = await asyncio.gather(*(client.complete(r) for r in reqs))
        await client.close()
        return list(done)

    done = asyncio.run(run())
    assert len({e.id for e in done}) == 10
    assert all(e.usage.completion_tokens <= 3 for e in done)


def test_queued_requests_run_when_a_whole_batch_ends_in_one_tick(umad) -> None:
    """Eight equal requests in one write: four start in the same tick and end in the same
    tick; the four waiting ones must then be admitted (the engine must not go to sleep)."""
    s = raw_socket(umad.socket, timeout=60)
    reqs = [gen("Same prompt", id=f"q{i}", max_tokens=5, ignore_eos=True) for i in range(8)]
    s.sendall(b"".join(p.encode(r) for r in reqs))
    ended = set()
    while len(ended) < 8:
        ev = read_event(s)  # a hang here is the bug (socket timeout fails the test)
        assert ev is not None and not isinstance(ev, p.ErrorEvent), ev
        if isinstance(ev, p.EosEvent):
            assert ev.usage.completion_tokens == 5
            ended.add(ev.id)
    s.close()


@pytest.mark.parametrize("label", [{"qos": "background"}, {}])
def test_an_interactive_arrival_aborts_a_long_background_tick(tmp_path, label) -> None:
    """Once interactive traffic is quiet, bulk prefill runs in whole-batch ticks (over a
    second each here); a chat turn arriving meanwhile stops the tick instead of waiting for
    it, and the document redoes that chunk and still completes. The same whether the
    document is labeled background or not: its long prompt is bulk work either way."""
    daemon = start_daemon(tmp_path, "--quiet-ms", "1")
    try:
        doc = "The cat sat on the mat and looked at the garden. " * 150  # ~1,650 tokens
        with daemon.client() as bg, daemon.client() as chat:
            bg.send(gen(doc, id="doc", max_tokens=4, ignore_eos=True, **label))
            deadline = time.monotonic() + 120
            while daemon.metrics()["prompt_tokens_total"] < 512:  # one whole tick is done,
                assert time.monotonic() < deadline  # the next 512-token tick is running
                time.sleep(0.02)
            answer = chat.complete(gen("Say hi.", id="chat", max_tokens=4, ignore_eos=True))
            assert answer.reason == "length" and answer.usage.completion_tokens == 4
            events = [bg.read_event()]
            while not isinstance(events[-1], p.EosEvent):
                events.append(bg.read_event())
        assert events[-1].reason == "length" and events[-1].usage.completion_tokens == 4
        m = wait_idle(daemon)
        assert m["ticks_aborted_total"] >= 1
        assert m["kv_cells_used"] == 0
        assert "ERROR" not in daemon.log()  # the abort's llama.cpp messages stay at debug
    finally:
        daemon.stop()
