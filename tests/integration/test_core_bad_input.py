"""Every bad input gets its documented error; the daemon keeps serving; nothing leaks."""

from __future__ import annotations

import json

import pytest

from uma_serve.core import protocol as p

from .helpers import frame, gen, raw_socket, read_event, wait_idle


def ask_raw(umad, payload: bytes) -> p.Event | None:
    s = raw_socket(umad.socket)
    try:
        s.sendall(frame(payload))
        return read_event(s)
    finally:
        s.close()


@pytest.mark.parametrize(
    "payload, code",
    [
        (b"{this is not json", p.E_PROTO),
        (b'"a string"', p.E_PROTO),
        (b'{"id": "x", "prompt": 42}', p.E_PROTO),
        (b'{"id": "x", "prompt": "hi", "max_tokens": 0}', p.E_PROTO),
        (b'{"id": "x", "prompt": "hi", "max_tokens": -5}', p.E_PROTO),
        (b'{"id": "x", "prompt": "hi", "temperature": "hot"}', p.E_PROTO),
        (b'{"type": "explode", "id": "x"}', p.E_PROTO),
        (b'{"id": "x", "prompt": "\xc3\x28"}', p.E_PROTO),
        (b'{"id": "x", "prompt": "hi", "max_tokens": 100000}', p.E_LIMIT_TOKENS),
        (b'{"id": "x", "prompt": "hi", "logit_bias": {"-3": 1}}', p.E_PROTO),
        (b'{"id": "x", "prompt": "hi", "logit_bias": {"3": 101}}', p.E_PROTO),
        (b'{"id": "x", "prompt": "hi", "logit_bias": {"99999999": 1}}', p.E_PROTO),
        (b'{"id": "x", "prompt": "a\\u0000b"}', p.E_PROTO),
        (b'{"id": "x", "messages": [{"role": "user", "content": "a\\u0000b"}]}', p.E_PROTO),
        (b'{"id": "x", "prompt": "hi", "stop": ' + b"[" * 1000 + b"]" * 1000 + b"}", p.E_PROTO),
    ],
)
def test_invalid_request_gets_error_and_connection_survives(umad, payload: bytes, code: str):
    s = raw_socket(umad.socket)
    s.sendall(frame(payload))
    ev = read_event(s)
    assert isinstance(ev, p.ErrorEvent) and ev.code == code and ev.message
    s.sendall(p.encode(p.HealthRequest(id="h")))  # still served
    assert isinstance(read_event(s), p.HealthEvent)
    s.close()


def test_frame_over_maximum_is_answered_then_closed(umad) -> None:
    s = raw_socket(umad.socket)
    s.sendall(p.HEADER.pack(2**31))  # claims 2 GiB: nothing of that size is allocated
    ev = read_event(s)
    assert isinstance(ev, p.ErrorEvent) and ev.code == p.E_FRAME
    assert read_event(s) is None  # closed
    s.close()
    with umad.client() as c:
        assert c.health().status == "ok"


def test_prompt_over_max_prompt_bytes(umad) -> None:
    ev = ask_raw(umad, json.dumps({"id": "big", "prompt": "x" * 20001}).encode())
    assert isinstance(ev, p.ErrorEvent) and ev.code == p.E_LIMIT and "20001 bytes" in ev.message


def test_prompt_over_the_context(umad) -> None:
    prompt = "hello " * 3000  # 18000 bytes, under the byte limit; ~3000 tokens > 1024 per seq
    ev = ask_raw(umad, json.dumps({"id": "long", "prompt": prompt}).encode())
    assert isinstance(ev, p.ErrorEvent) and ev.code == p.E_LIMIT and "context" in ev.message


def test_duplicate_id_in_flight(umad) -> None:
    s = raw_socket(umad.socket)
    req = gen("Dup", id="same", max_tokens=50, ignore_eos=True)
    s.sendall(p.encode(req) + p.encode(req))
    events = []
    while not events or not isinstance(events[-1], p.EosEvent):
        events.append(read_event(s))
    errors = [e for e in events if isinstance(e, p.ErrorEvent)]
    assert len(errors) == 1 and errors[0].code == p.E_DUP_ID
    s.close()


def test_more_than_max_sessions_is_busy(umad) -> None:
    s = raw_socket(umad.socket)
    reqs = [gen(f"Busy {i}", id=f"busy-{i}", max_tokens=200, ignore_eos=True) for i in range(17)]
    s.sendall(b"".join(p.encode(r) for r in reqs))  # the 17th is over --max-sessions 16
    while True:
        ev = read_event(s)
        if isinstance(ev, p.ErrorEvent):
            break
    assert (ev.code, ev.id) == (p.E_BUSY, "busy-16")
    s.close()  # the other 16 (4 running, 12 waiting) are cancelled by the disconnect
    assert wait_idle(umad)["kv_cells_used"] == 0


def test_unknown_cancel_is_harmless(umad) -> None:
    s = raw_socket(umad.socket)
    s.sendall(p.encode(p.Cancel(id="nobody")))
    s.sendall(p.encode(p.HealthRequest(id="h")))
    assert isinstance(read_event(s), p.HealthEvent)
    s.close()


def test_truncated_frame_then_disconnect(umad) -> None:
    s = raw_socket(umad.socket)
    s.sendall(p.HEADER.pack(100) + b'{"id": "half')
    s.close()
    with umad.client() as c:
        done = c.complete(gen("Still alive?", max_tokens=3))
    assert done.usage.completion_tokens >= 1


@pytest.mark.parametrize(
    "payload, field",
    [
        (b'{"id": "nul", "prompt": "a\\u0000b"}', "'prompt'"),
        (
            b'{"id": "nul", "messages": [{"role": "user", "content": "ok"}, '
            b'{"role": "assistant", "content": "a\\u0000b"}]}',
            "'messages[1].content'",
        ),
    ],
)
def test_nul_byte_is_rejected_naming_the_field(umad, payload: bytes, field: str) -> None:
    ev = ask_raw(umad, payload)
    assert isinstance(ev, p.ErrorEvent) and (ev.code, ev.id) == (p.E_PROTO, "nul")
    assert field in ev.message and "NUL" in ev.message


@pytest.mark.parametrize("depth", [1000, 100_000])
def test_deeply_nested_json_is_answered_and_other_streams_go_on(umad, depth: int) -> None:
    """msgspec's parser recurses per level: a RecursionError once dropped the connection."""
    s = raw_socket(umad.socket)
    s.sendall(p.encode(gen("Keep going:", id="live", max_tokens=30, ignore_eos=True)))
    assert isinstance(read_event(s), p.TokenEvent)  # the stream is running
    nested = b"[" * depth + b"]" * depth
    s.sendall(frame(b'{"id": "deep", "prompt": "hi", "stop": ' + nested + b"}"))
    events = []
    while not events or not isinstance(events[-1], p.EosEvent):
        events.append(read_event(s))
    errors = [e for e in events if isinstance(e, p.ErrorEvent)]
    assert len(errors) == 1 and errors[0].code == p.E_PROTO
    assert "nested too deep" in errors[0].message
    assert events[-1].id == "live" and events[-1].reason == "length"
    assert events[-1].usage.completion_tokens == 30  # the stream was not cut
    s.sendall(p.encode(p.HealthRequest(id="h")))
    assert isinstance(read_event(s), p.HealthEvent)
    s.close()
