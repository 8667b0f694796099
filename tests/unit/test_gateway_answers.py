"""The answer shapes and the stream pump without a model: a stream's chunks carry what the
whole answer carries, the pump hands each token event to one call of the answer, and an admin
reply of the wrong type is refused (the real routes: tests/integration/test_gateway_*.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from uma_serve.clients.client import E_BAD_REPLY, CoreError
from uma_serve.core import protocol as p
from uma_serve.gateway.answer import Answer, End, Job, Result
from uma_serve.gateway.core_pool import CorePool
from uma_serve.gateway.drain import Stop
from uma_serve.gateway.errors import ApiError
from uma_serve.gateway.openai_answers import ChatAnswer, TextAnswer, ToolChatAnswer
from uma_serve.gateway.streaming import _sse_body

USAGE = p.Usage(prompt_tokens=5, completion_tokens=3)
TIMINGS = p.Timings(0.0, 1.0, 1.0, 1.0, 1.0)
CALL = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'


def token(text: str, rid: str = "r") -> p.TokenEvent:
    return p.TokenEvent(id=rid, text=text, token_id=1)


def eos(reason: str = "stop") -> p.EosEvent:
    return p.EosEvent(id="r", reason=reason, usage=USAGE, timings=TIMINGS)  # type: ignore[arg-type]


def pump(job: Job, items: list[tuple[int, p.Event]], fail: CoreError | None = None) -> bytes:
    """The bytes the stream pump writes for these (choice, event) items."""

    async def events() -> AsyncIterator[tuple[int, p.Event]]:
        for item in items[1:]:
            yield item
        if fail is not None:
            raise fail

    async def cleanup() -> None:
        return None

    async def run() -> bytes:
        body = _sse_body(job, items[0], events(), Stop(), cleanup)
        return b"".join([chunk async for chunk in body])

    return asyncio.run(run())


def chunks(data: bytes) -> list[Any]:
    """The ``data:`` payloads of an OpenAI stream, JSON-decoded ([DONE] as a string)."""
    out = []
    for event in data.decode().split("\n\n"):
        if event.startswith("data: "):
            payload = event.removeprefix("data: ")
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


class Recorder(Answer):
    """An answer that notes each call the pump makes."""

    def __init__(self, n: int = 1) -> None:
        self.n, self.calls = n, []

    def open(self) -> bytes:
        self.calls.append("open")
        return b"<open>"

    def token(self, ev: p.TokenEvent, i: int) -> bytes:
        self.calls.append(("token", i, ev.text))
        return b"<t>"

    def end(self, ev: End, i: int) -> bytes:
        self.calls.append(("end", i))
        return b"<end>"

    def error(self, err: ApiError) -> bytes:
        self.calls.append(("error", err.status, err.code))
        return b"<error>"

    def whole(self, results: list[Result]) -> dict[str, Any]:
        raise AssertionError("not streamed")


def test_the_pump_gives_each_token_to_one_call_and_stops_after_every_choice_ended():
    answer = Recorder(n=2)
    job = Job(p.Generate(id="r", prompt="x", n=2), answer)
    items = [(0, token("a")), (1, token("b")), (0, eos()), (1, token("c")), (1, eos())]
    out = pump(job, [*items, (0, token("late"))])
    assert answer.calls == [
        "open", ("token", 0, "a"), ("token", 1, "b"), ("end", 0), ("token", 1, "c"), ("end", 1)
    ]  # fmt: skip
    assert out == b"<open><t><t><end><t><end>"


def test_the_pump_ends_a_broken_stream_with_the_answers_error():
    answer = Recorder()
    job = Job(p.Generate(id="r", prompt="x"), answer)
    pump(job, [(0, token("a"))], fail=CoreError(p.E_IO, "connection lost"))
    assert answer.calls[-1] == ("error", 503, "core_unavailable")
    answer = Recorder()
    pump(Job(p.Generate(id="r", prompt="x"), answer), [(0, token("a"))])  # no end event
    assert answer.calls[-1] == ("error", 500, None)


def test_a_text_stream_carries_the_whole_answers_text_echo_and_usage():
    whole = TextAnswer("cmpl-1", "m", echo="Q:").whole([("Hello", "length", USAGE, None)])
    answer = TextAnswer("cmpl-1", "m", echo="Q:", include_usage=True)
    answer.prepare()
    got = chunks(pump(Job(p.Generate(id="r", prompt="Q:"), answer), [
        (0, token("Hel")), (0, token("lo")), (0, eos("length"))
    ]))  # fmt: skip
    texts = [c["choices"][0]["text"] for c in got[:-2]]
    assert "".join(texts) == whole["choices"][0]["text"] == "Q:Hello"
    assert [c["choices"][0]["finish_reason"] for c in got[:-2]] == [None, None, "length"]
    assert got[-2]["choices"] == [] and got[-2]["usage"]["total_tokens"] == 8
    assert got[-1] == "[DONE]" and all(c["id"] == "cmpl-1" for c in got[:-1])


def test_a_chat_stream_opens_each_choice_with_the_role():
    answer = ChatAnswer("chatcmpl-1", "m", n=2)
    got = chunks(pump(Job(p.Generate(id="r", prompt="x", n=2), answer), [
        (1, token("Hi")), (0, eos()), (1, eos())
    ]))  # fmt: skip
    deltas = [(c["choices"][0]["index"], c["choices"][0]["delta"]) for c in got[:-1]]
    assert deltas == [
        (1, {"role": "assistant", "content": ""}), (1, {"content": "Hi"}),
        (0, {"role": "assistant", "content": ""}), (0, {}), (1, {}),
    ]  # fmt: skip
    assert got[-1] == "[DONE]"


def test_a_tool_call_streamed_and_whole_is_the_same_call():
    whole = ToolChatAnswer("chatcmpl-1", "m", forced=False).whole([(CALL, "stop", USAGE, None)])
    message = whole["choices"][0]["message"]
    assert whole["choices"][0]["finish_reason"] == "tool_calls" and message["content"] is None
    (call,) = message["tool_calls"]
    answer = ToolChatAnswer("chatcmpl-1", "m", forced=False)
    pieces = [(0, token(CALL[i : i + 7])) for i in range(0, len(CALL), 7)]
    got = chunks(pump(Job(p.Generate(id="r", prompt="x"), answer), [*pieces, (0, eos())]))
    deltas = [c["choices"][0]["delta"] for c in got[:-1]]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["function"]["name"] == call["function"]["name"] == "get_time"
    arguments = "".join(c["function"].get("arguments", "") for c in calls)
    assert json.loads(arguments) == json.loads(call["function"]["arguments"]) == {"zone": "UTC"}
    assert not any(d.get("content") for d in deltas)
    assert got[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_an_admin_answer_of_another_type_is_a_bad_reply():
    class Client:
        closed = False

        async def ask(self, request: Any) -> p.Event:
            return p.HealthEvent(id=None, status="ok", active_sessions=0, waiting_sessions=0)

    async def run() -> None:
        pool = CorePool("/nonexistent.sock", size=1)
        pool._slots = [Client()]  # type: ignore[list-item]
        assert (await pool.ask(p.HealthRequest(), p.HealthEvent)).status == "ok"
        with pytest.raises(CoreError) as err:
            await pool.ask(p.InfoRequest(), p.InfoEvent)
        assert err.value.code == E_BAD_REPLY

    asyncio.run(run())
