"""HTTP/1.1 limits below the app: a request head's size and the time it may take to arrive.

uvicorn's httptools protocol has neither: a client may send a head of any size (httptools
buffers a header value until it ends) or send half a head and stay connected, holding the
connection forever. ``limited_protocol`` subclasses it:

- a head (request line and headers) over ``max_header_bytes`` gets 431 and the connection
  closes: counted as it arrives (a head still coming is refused once past the limit, before
  httptools has buffered more) and measured from its fields once complete;
- a head not complete ``header_timeout`` seconds after its first byte gets 408; a connection
  that sends nothing at all for that long is closed.

Both answers, and the 400 uvicorn gives a request that does not parse, are OpenAI error
objects, written by hand (no ASGI request exists yet), with
``Connection: close``. The connection is half-closed and what the client still sends is read
and dropped for a moment, so that a client still writing its head reads the answer instead
of a reset. The body's own deadline (``--body-timeout``) is the app's (intake.read_body).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("uma.gateway")
LINGER_S = 2.0  # how long a refused connection's further input is read and dropped
REASONS = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large"}


def raw_error(status: int, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 error answer with an OpenAI error object, closing the connection."""
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": code,
            }
        }
    ).encode()
    head = (
        f"HTTP/1.1 {status} {REASONS[status]}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a head size limit and a head deadline (0: none);
    ``limited_protocol`` makes the subclass that carries the two limits."""

    max_header_bytes = 0
    header_timeout = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes: int | None = 0  # bytes of the head so far; None: not in a head
        self._head_size = 0  # request line and header fields of the current head
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # answered and half-closed: drop what still comes
        if self._head_bytes is not None:
            self._head_bytes += len(data)
        super().data_received(data)
        limit = self.max_header_bytes
        if limit > 0 and self._head_bytes is not None and self._head_bytes > limit:
            self._refuse_too_large()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request httptools cannot parse, as an OpenAI error object."""
        self.transport.write(raw_error(400, msg, "invalid_http_request"))
        self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_bytes is None:
            self._head_bytes = 1  # a new head began (its first chunk was not counted)
        self._head_size = 0
        self._arm_head_timer()

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        self._disarm_head_timer()
        if self._refused:
            return
        if self.max_header_bytes > 0 and self._head_size > self.max_header_bytes:
            # a head that arrived whole within a read or two: measured from its fields
            self._refuse_too_large()
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()

    def _arm_head_timer(self) -> None:
        if self.header_timeout > 0 and self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self._refused:
            return
        if not self._head_bytes:
            self.transport.close()  # connected, sent nothing: nobody to answer
            return
        self._refuse(
            408,
            f"request headers not received within {self.header_timeout:g} s",
            "request_timeout",
        )

    def _refuse_too_large(self) -> None:
        self._refuse(
            431,
            f"request headers over the limit of {self.max_header_bytes} bytes",
            "request_header_fields_too_large",
        )

    def _refuse(self, status: int, message: str, code: str) -> None:
        if self.transport.is_closing() or self._refused:
            return
        log.warning("refused a connection: %d %s", status, message)
        self._refused = True
        self._disarm_head_timer()
        self.transport.write(raw_error(status, message, code))
        if self.transport.can_write_eof():
            with contextlib.suppress(OSError):
                self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)


def limited_protocol(max_header_bytes: int, header_timeout: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a head size limit and a head deadline (0: none)."""
    limits = {"max_header_bytes": max_header_bytes, "header_timeout": header_timeout}
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), limits)
