"""The skeleton shared by the routes that speak another API over the chat pipeline
(/v1/responses, /v1/messages): each turns its body into a ChatRequest, and its answer from
the chat job's whole result or from the core's event stream.

The steps and their errors are the chat route's (gateway/routes.py): 415 for a body not
declared JSON, 413/408 for its size and deadline, 429 over --max-inflight, 503 while shutting
down, 400/404 from validation, then the same core request a chat completion makes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from uma_serve.clients.client import CoreError
from uma_serve.core import protocol as p
from uma_serve.gateway import model_routing, routes
from uma_serve.gateway.answer import Job, end_error
from uma_serve.gateway.openai_schema import ChatRequest
from uma_serve.gateway.streaming import (
    Choice,
    ClientGone,
    GuardedEventSource,
    _close_once,
    first_event,
    race_disconnect,
    tagged,
)

# a body -> (its chat request, the unknown fields ignored)
ToChat = Callable[[bytes, Request], tuple[ChatRequest, list[str]]]


@dataclass
class Dialect:
    """How one foreign API is read and answered."""

    to_chat: ToChat
    # (the job, the request, the chat completion) -> the API's whole answer
    whole: Callable[[Job, Request, dict[str, Any]], dict[str, Any]]
    # (the job, the request, the first core event, the rest) -> the API's SSE events
    stream: Callable[[Job, Request, Choice, AsyncIterator[Choice]], AsyncIterator[bytes]]


async def serve(request: Request, dialect: Dialect) -> Response:
    """One request of ``dialect`` through the chat pipeline (the module docstring's steps)."""
    state = request.app.state
    state.drain.refuse_new()
    routes.check_json_body(request)
    try:
        body, stop, release = await routes.body_and_place(request)
    except ClientGone:
        return Response(status_code=499)
    handed_off = False
    try:
        req, request.state.ignored_fields = dialect.to_chat(body, request)
        model, info = await model_routing.resolve(request, req.model)
        job = routes._chat_job(request, req, info, model, routes.qos_of(request, req))
        if req.stream:
            response = await _stream(request, dialect, job, release, stop)
            handed_off = True
            return response
        result = await race_disconnect(request, routes._run_whole(request, job), stop)
        return JSONResponse(dialect.whole(job, request, result))
    except ClientGone:
        return Response(status_code=499)
    finally:
        if not handed_off:
            release()


async def _stream(
    request: Request, dialect: Dialect, job: Job, release: Any, stop: Any
) -> Response:
    """Wait for the first core event (an early error is still an HTTP status), then stream."""
    events = tagged(request.app.state.pool.stream(job.generate))
    try:
        first = await first_event(request, events, stop)
    except CoreError as exc:
        await events.aclose()
        raise routes._core_api_error(exc, job) from None
    except BaseException:
        await events.aclose()
        raise
    ev = first[1]
    if isinstance(ev, p.EosEvent | p.CompletionEvent) and (err := end_error(job, ev)):
        await events.aclose()
        raise err
    cleanup = _close_once(events, release)

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in dialect.stream(job, request, first, events):
                yield chunk
        finally:
            await cleanup()

    return GuardedEventSource(body(), job.id, cleanup=cleanup)


def sse(event: str, data: dict[str, Any]) -> bytes:
    """One named SSE event (``event:`` and ``data:`` lines), as both APIs send them."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()
