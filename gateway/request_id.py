"""X-Request-Id on every response: the completion's id where a route names one (so a log line,
a client's report and the core's request id meet), else the caller's own X-Request-Id, else a
fresh one."""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"


class RequestIdMiddleware:
    """Pure ASGI (no body buffering, safe for SSE)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(HEADER, b"")
        fallback = given[:200] if given.isascii() and given else f"req-{uuid.uuid4().hex}".encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                if not any(k.lower() == HEADER for k, _ in headers):
                    rid = (scope.get("state") or {}).get("request_id")
                    headers.append((HEADER, rid.encode() if rid else fallback))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_id)
