"""An answer given before the request's body was read to its end closes the connection.

A 401, 404, 413, 415 or 408 is answered before (or while) the body arrives. uvicorn then
keeps the connection alive, and a body that comes after the answer cancels its keep-alive
timer without re-arming it: the connection stayed open for good, and a client holding a
thousand of them used up the gateway's descriptors. Such an answer gets ``Connection: close``,
so uvicorn closes the connection once the answer is written, and what still arrives is dropped.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


def declares_body(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the request head announces a body (a chunked one, or a non-zero length)."""
    for name, value in headers:
        if name.lower() == b"transfer-encoding":
            return True
        if name.lower() == b"content-length":
            return value.strip() not in (b"", b"0")
    return False


def close_unread_body(app: ASGIApp) -> ASGIApp:
    """``app`` whose answers close the connection when the declared body was not all read."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not declares_body(scope["headers"]):
            await app(scope, receive, send)
            return
        read_all = False

        async def tracking_receive() -> Message:
            nonlocal read_all
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                read_all = True
            return message

        async def closing_send(message: Message) -> None:
            if message["type"] == "http.response.start" and not read_all:
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*kept, (b"connection", b"close")]}
            await send(message)

        await app(scope, tracking_receive, closing_send)

    return wrapped
