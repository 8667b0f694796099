"""A response's headers and its first body chunk leave in one TCP segment.

uvicorn writes ``http.response.start`` and the first ``http.response.body`` in two sends (with
TCP_NODELAY, two segments). The first wakes the client for headers alone; on a machine whose
cores are busy with the model, the client then takes a core before the first chunk is out.
For a stream that first chunk is the first token (its headers wait for it so that an early
error is still an HTTP status), so the second wake-up lands on the TTFT path: `bench
ipc-overhead` measured the gateway adding 0.78-1.01 ms to TTFT p50 without this and 0.50-0.68
ms with it (docs/BENCHMARKS.md). ASGI has no way to join the two writes, so the socket is
corked (TCP_CORK) from the headers to the first body chunk.

The socket is uvicorn's (its ``send`` is a bound method of the request cycle, which holds the
transport); on another server, a Unix socket or a platform without TCP_CORK the app runs
unchanged.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

TCP_CORK = getattr(socket, "TCP_CORK", None)


def tcp_socket_of(send: Send) -> socket.socket | None:
    """The TCP socket behind uvicorn's ``send``, or None."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None or TCP_CORK is None:
        return None
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    return sock


def _cork(sock: Any, on: bool) -> None:
    """Cork or uncork; nothing once the connection is closed. uvloop's socket object then
    has the descriptor -1 and ``setsockopt`` raises ValueError ("negative file descriptor"):
    the client is gone, which the server's ``send`` (it drops the message) and the
    disconnect the app receives report."""
    if sock.fileno() < 0:
        return
    with contextlib.suppress(OSError, ValueError):  # closed meanwhile: as above
        sock.setsockopt(socket.IPPROTO_TCP, TCP_CORK, 1 if on else 0)


def cork_response_head(app: ASGIApp) -> ASGIApp:
    """Wrap an ASGI app (outermost, so that ``send`` is the server's own)."""

    async def corked_app(scope: Scope, receive: Receive, send: Send) -> None:
        sock = tcp_socket_of(send) if scope["type"] == "http" else None
        if sock is None:
            await app(scope, receive, send)
            return
        corked = False

        async def send_corked(message: Message) -> None:
            nonlocal corked
            if message["type"] == "http.response.start":
                _cork(sock, True)
                corked = True
                await send(message)
            elif corked:
                corked = False
                try:
                    await send(message)
                finally:
                    _cork(sock, False)  # uncorking sends what is held, now
            else:
                await send(message)

        try:
            await app(scope, receive, send_corked)
        finally:
            if corked:
                _cork(sock, False)

    return corked_app
