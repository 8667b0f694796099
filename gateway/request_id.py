"""The headers a response carries from its request's state, added by one middleware:
X-Request-Id on every response (the completion's id where a route names one, so that a log
line, a client's report and the core's request id meet; else the caller's own X-Request-Id,
else a fresh one), X-UMA-Ignored-Fields where unknown request fields were ignored
(gateway/lenient.py), and with several cores X-UMA-Core, the core that answered (its
RouteNote, which also carries the X-Session-Id header in: gateway/router.py)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from contextvars import ContextVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from uma_serve.gateway.router import CORE_HEADER, NOTE, SESSION_HEADER, RouteNote

HEADER = b"x-request-id"
IGNORED_HEADER = b"x-uma-ignored-fields"
# the request id of the request this task serves, read when a line is logged (RequestIdFilter)
CURRENT: ContextVar[Callable[[], bytes] | None] = ContextVar("uma_request_id", default=None)


class ResponseHeaders:
    """Pure ASGI (no body buffering, safe for SSE). ``routed``: several cores (X-UMA-Core)."""

    def __init__(self, app: ASGIApp, routed: bool = False) -> None:
        self.app = app
        self.routed = routed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or [])
        rid = given.get(HEADER, b"")
        fallback = rid[:200] if rid.isascii() and rid else f"req-{uuid.uuid4().hex}".encode()

        def request_id() -> bytes:
            rid = (scope.get("state") or {}).get("request_id")
            return rid.encode() if rid else fallback

        def ignored_fields() -> bytes | None:
            # a field's name may hold any character: escaped to printable ASCII (a control
            # character in a header value would abort the response)
            names = (scope.get("state") or {}).get("ignored_fields")
            return ", ".join(names).encode("unicode_escape")[:4096] if names else None

        CURRENT.set(request_id)  # this request's task (uvicorn runs one per request) only
        headers = [(HEADER, request_id), (IGNORED_HEADER, ignored_fields)]
        if not self.routed:
            await self.app(scope, receive, with_headers(send, headers))
            return
        session = given.get(SESSION_HEADER)
        note = RouteNote(session=session.decode("latin-1") if session else None)
        token = NOTE.set(note)

        def core() -> bytes | None:
            return note.core.encode() if note.core is not None else None

        try:
            await self.app(scope, receive, with_headers(send, [*headers, (CORE_HEADER, core)]))
        finally:
            NOTE.reset(token)


class RequestIdFilter(logging.Filter):
    """Gives a line logged while a request is served (the access line, a router line) that
    request's id as ``request_id``: the same id its X-Request-Id header and the core carry."""

    def filter(self, record: logging.LogRecord) -> bool:
        current = CURRENT.get()
        if current is not None and not hasattr(record, "request_id"):
            record.request_id = current().decode(errors="replace")
        return True


def with_headers(send: Send, headers: list[tuple[bytes, Callable[[], bytes | None]]]) -> Send:
    """``send`` that adds each ``name: value()`` to the response's head, unless the app set it
    or ``value()`` is None (read when the head is sent: the route has run by then)."""

    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            out = list(message.get("headers") or [])
            given = {k.lower() for k, _ in out}
            for name, value in headers:
                if name not in given and (v := value()) is not None:
                    out.append((name, v))
            message = {**message, "headers": out}
        await send(message)

    return send_with_headers
