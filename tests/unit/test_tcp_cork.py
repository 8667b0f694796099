"""gateway/tcp_cork.py on hand-built ASGI calls: when the socket is corked and uncorked, and
that anything but uvicorn's TCP connection passes through untouched (the real socket's
behaviour is in tests/integration/test_gateway_wire.py)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from uma_serve.gateway import tcp_cork
from uma_serve.gateway.tcp_cork import cork_response_head

pytestmark = pytest.mark.skipif(tcp_cork.TCP_CORK is None, reason="no TCP_CORK here")


class FakeSocket:
    def __init__(
        self, family: int = socket.AF_INET, fail: bool = False, closed: bool = False
    ) -> None:
        self.family = family
        self.fail = fail
        self.closed = closed
        self.log: list[Any] = []

    def fileno(self) -> int:
        return -1 if self.closed else 7

    def setsockopt(self, level: int, option: int, value: int) -> None:
        if self.closed:  # as uvloop's socket object once the transport closed
            raise ValueError("negative file descriptor")
        if self.fail:
            raise OSError("connection reset")
        assert (level, option) == (socket.IPPROTO_TCP, tcp_cork.TCP_CORK)
        self.log.append(("cork", value))


class FakeTransport:
    def __init__(self, sock: FakeSocket | None) -> None:
        self.sock = sock

    def get_extra_info(self, name: str) -> Any:
        return self.sock if name == "socket" else None


class FakeCycle:
    """Stands for uvicorn's request cycle: its ``send`` is a bound method with a transport."""

    def __init__(self, sock: FakeSocket | None) -> None:
        self.transport = FakeTransport(sock)
        self.sock = sock

    async def send(self, message: dict) -> None:
        if self.sock is not None:
            self.sock.log.append(message["type"])


def run(app: Any, send: Any, scope_type: str = "http") -> None:
    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    asyncio.run(cork_response_head(app)({"type": scope_type}, receive, send))


async def streaming_app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for chunk in (b"data: 1\n\n", b"data: 2\n\n"):
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def test_corked_from_the_headers_to_the_first_chunk_only():
    sock = FakeSocket()
    run(streaming_app, FakeCycle(sock).send)
    assert sock.log == [
        ("cork", 1),
        "http.response.start",
        "http.response.body",
        ("cork", 0),
        "http.response.body",
        "http.response.body",
    ]


def test_uncorked_when_the_app_fails_after_the_headers():
    sock = FakeSocket()

    async def failing(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        run(failing, FakeCycle(sock).send)
    assert sock.log == [("cork", 1), "http.response.start", ("cork", 0)]


def test_a_gone_client_does_not_turn_into_a_cork_error():
    sock = FakeSocket(fail=True)
    run(streaming_app, FakeCycle(sock).send)  # setsockopt raises OSError: swallowed
    assert sock.log == ["http.response.start"] + ["http.response.body"] * 3


def test_a_closed_connection_is_not_corked():
    """uvloop's socket object of a closed connection has the descriptor -1 and raises
    ValueError on setsockopt: that is a gone client, not an error of the request."""
    sock = FakeSocket(closed=True)
    run(streaming_app, FakeCycle(sock).send)
    assert sock.log == ["http.response.start"] + ["http.response.body"] * 3


def test_a_connection_closing_meanwhile_is_not_an_error():
    sock = FakeSocket()

    class ClosingCycle(FakeCycle):
        async def send(self, message: dict) -> None:
            await super().send(message)
            sock.closed = True  # closed after the headers went out

    sock.fileno = lambda: 7  # type: ignore[method-assign]  # still open when checked
    run(streaming_app, ClosingCycle(sock).send)
    assert sock.log[0] == ("cork", 1) and sock.log.count(("cork", 0)) == 0


@pytest.mark.parametrize(
    "send",
    [
        FakeCycle(FakeSocket(family=socket.AF_UNIX)).send,  # a Unix socket
        FakeCycle(None).send,  # no socket known
    ],
)
def test_other_connections_pass_through(send):
    sent: list[str] = []

    async def app(scope: Any, receive: Any, send_: Any) -> None:
        assert send_ is send  # not wrapped
        sent.append("called")

    run(app, send)
    assert sent == ["called"]
    sock = send.__self__.sock
    assert sock is None or sock.log == []


def test_plain_functions_and_other_scopes_pass_through():
    async def send(message: dict) -> None:  # not a bound method: no transport to find
        pass

    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send_: Any) -> None:
        seen.append(send_)

    run(app, send)
    lifespan_send = FakeCycle(FakeSocket()).send
    run(app, lifespan_send, scope_type="lifespan")
    assert seen == [send, lifespan_send]
