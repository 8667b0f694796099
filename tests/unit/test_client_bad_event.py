"""An event the client library cannot decode ends its own request, cancelled in the core, and
not the connection: the other requests multiplexed on it (the gateway's pool carries every
HTTP client over a few connections) go on. Frames are length-prefixed, so the next one reads
as it should; a frame whose request cannot be told still ends the connection."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import msgspec
import pytest

from uma_serve.clients.client import E_BAD_REPLY, AsyncUmaClient, CoreError
from uma_serve.core import protocol as p

TIMINGS = p.Timings(queue_ms=0.0, ttft_ms=1.0, e2e_ms=2.0, prompt_ms=1.0, decode_tokens_per_s=None)


def frame(body: bytes) -> bytes:
    return p.HEADER.pack(len(body)) + body


def null_logprob(rid: str) -> bytes:
    """A token event whose logprob is JSON null (a NaN or -inf encoded): no float decodes."""
    lp = p.Logprobs(p.TokenLogprob(5, -1.0, b"a"), [])
    event = msgspec.to_builtins(p.TokenEvent(id=rid, text="a", token_id=5, logprobs=lp))
    event["logprobs"][0][1] = None
    return frame(msgspec.json.encode(event))


async def session(bad_frame: bytes) -> tuple[list, list, list[p.Request]]:
    """Two requests on one connection; the fake core answers the first with ``bad_frame``
    and the second with a token and its end. Returns each one's outcome and what the core
    read after the two requests."""
    ours, theirs = socket.socketpair()
    client = AsyncUmaClient(*await asyncio.open_unix_connection(sock=ours))
    core_in, core_out = await asyncio.open_unix_connection(sock=theirs)

    async def outcome(rid: str) -> list:
        try:
            return [type(e).__name__ async for e in client.stream(p.Generate(id=rid, prompt="x"))]
        except CoreError as err:
            return [err.code]

    runs = [asyncio.create_task(outcome(rid)) for rid in ("bad", "good")]
    for _ in range(2):
        p.decode_request(await p.read_frame(core_in))
    core_out.write(bad_frame)
    core_out.write(p.encode(p.TokenEvent(id="good", text="b", token_id=6)))
    core_out.write(p.encode(p.EosEvent("good", "length", p.Usage(1, 1), TIMINGS)))
    await core_out.drain()
    bad, good = await asyncio.wait_for(asyncio.gather(*runs), 10)
    after = []
    with contextlib.suppress(asyncio.TimeoutError):
        while True:
            after.append(p.decode_request(await asyncio.wait_for(p.read_frame(core_in), 0.5)))
    await client.close()
    core_out.close()
    return bad, good, after


def test_an_undecodable_event_ends_its_own_request_only() -> None:
    bad, good, after = asyncio.run(session(null_logprob("bad")))
    assert bad == [E_BAD_REPLY]
    assert good == ["TokenEvent", "EosEvent"]
    assert [type(r).__name__ for r in after] == ["Cancel"] and after[0].id == "bad"


@pytest.mark.parametrize("body", [b"not json", b'["no", "id"]', b'{"event": "token", "id": 7}'])
def test_a_frame_no_request_can_be_told_from_ends_the_connection(body: bytes) -> None:
    bad, good, _ = asyncio.run(session(frame(body)))
    assert bad == good == [E_BAD_REPLY]
