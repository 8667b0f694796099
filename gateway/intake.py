"""A request's intake, before its body is parsed: refused while the gateway shuts down (503),
a body not declared JSON refused (415: a page's form or text/plain POST needs no CORS
preflight), the body read under its size limit (413) and deadline (408), an in-flight place
taken (429 beyond --max-inflight; a slow body holds none); and the core's facts a body is
checked against (its info, the model's names)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.requests import ClientDisconnect, Request

from uma_serve.clients.client import CoreError
from uma_serve.core import protocol as p
from uma_serve.gateway.errors import ApiError, from_core_error, too_many_requests
from uma_serve.gateway.streaming import ClientGone

# Cap on bytes read (and thrown away) from an oversized body before answering 413, so that a
# client still sending is not cut off mid-write and sees the 413 instead of a reset.
DRAIN_CAP = 64 << 20


class Inflight:
    """A non-blocking gate: requests over the limit are refused, never queued in the gateway."""

    def __init__(self, limit: int, gauge: Any = None) -> None:
        self.limit = limit
        self.current = 0
        self.gauge = gauge

    def enter(self) -> None:
        if self.limit > 0 and self.current >= self.limit:
            held = f"{self.current} requests in flight (--max-inflight {self.limit})"
            raise too_many_requests(f"{held}: retry later")
        self.current += 1
        if self.gauge is not None:
            self.gauge.inc()

    def leave(self) -> None:
        self.current -= 1
        if self.gauge is not None:
            self.gauge.dec()


def check_json_body(request: Request) -> None:
    """415 unless the body is declared ``application/json`` (parameters such as charset
    allowed). A browser sends text/plain, form and multipart bodies cross-origin without a
    CORS preflight: refusing them keeps any web page from driving a gateway without keys."""
    declared = request.headers.get("content-type")
    media = (declared or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        got = f"got {declared!r}" if declared is not None else "none was given"
        raise ApiError(
            415,
            f"Content-Type must be application/json ({got})",
            param="Content-Type",
            code="unsupported_media_type",
        )


async def read_body(request: Request, limit: int, timeout_s: float = 0) -> bytes:
    """The body, or 413 once it exceeds ``limit`` bytes, or 408 if it has not all arrived
    ``timeout_s`` seconds after the request's head (0: no deadline); 408 and 413 close the
    connection (the rest of the body is not read)."""
    too_big = ApiError(
        413,
        f"request body over the limit of {limit} bytes",
        code="request_too_large",
    )
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > DRAIN_CAP:
        raise too_big
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s if timeout_s > 0 else None):
            async for chunk in request.stream():
                size += len(chunk)
                if size <= limit:
                    chunks.append(chunk)
                elif size > DRAIN_CAP:
                    break
    except TimeoutError:
        raise ApiError(
            408,
            f"request body not received within {timeout_s:g} s (--body-timeout); "
            f"{size} bytes arrived",
            code="request_timeout",
            headers={"Connection": "close"},
        ) from None
    except ClientDisconnect:
        raise ClientGone from None
    if size > limit:
        raise too_big
    return b"".join(chunks)


async def core_info(request: Request) -> p.InfoEvent:
    try:
        return await request.app.state.router.info()
    except CoreError as exc:
        raise from_core_error(exc) from None


async def body_and_place(request: Request) -> tuple[bytes, Any, Callable[[], None]]:
    """The body (413, 408; ClientGone), then an in-flight place (429: a slow body holds none)
    and the drain's stop for the request; ``release`` gives both back."""
    state, settings = request.app.state, request.app.state.settings
    body = await read_body(request, settings.max_body_bytes, settings.body_timeout)
    state.drain.refuse_new()  # SIGTERM came while the body arrived
    state.inflight.enter()
    stop = state.drain.add()

    def release() -> None:
        state.drain.discard(stop)
        state.inflight.leave()

    return body, stop, release
