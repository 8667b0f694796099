"""Every generation route's request, from its intake to its answer: the route gives only
``parse`` (the body to a Job: gateway/answer.py); the rest is the same for every API.

The steps: the intake (gateway/intake.py: 503 while shutting down, 415, 413, 408, 429), the
route's parse (400, 404), the frame-size check (400: gateway/frame_limit.py), then the core:
streamed, the first event is awaited before the answer starts (honest TTFT; an early error is
still an HTTP status), then gateway/streaming.py pumps the rest into the answer; not
streamed, gateway/choices.py runs it to its end. A client gone is a 499.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from uma_serve.clients.client import CoreError
from uma_serve.core import protocol as p
from uma_serve.gateway import choices
from uma_serve.gateway.answer import Job, end_error
from uma_serve.gateway.drain import Stop
from uma_serve.gateway.errors import from_core_error
from uma_serve.gateway.frame_limit import check_frame
from uma_serve.gateway.intake import body_and_place, check_json_body, core_info
from uma_serve.gateway.streaming import ClientGone, first_event, race_disconnect, sse_response

# a route's own part: the request and its body -> the Job (400s and 404s raised as ApiError)
Parse = Callable[[Request, bytes], Awaitable[Job]]


async def serve(request: Request, parse: Parse) -> Response:
    """One generation request through the steps of the module's docstring."""
    request.app.state.drain.refuse_new()
    check_json_body(request)
    try:
        body, stop, release = await body_and_place(request)
    except ClientGone:
        return Response(status_code=499)
    handed_off = False
    try:
        job = await parse(request, body)
        info = await core_info(request)  # cached: no round trip
        gen = job.generate
        check_frame(gen, gen.n, info.max_frame_bytes, job.grammar_param, job.prompt_param)
        if gen.stream:
            response = await _start_stream(request, job, release, stop)
            handed_off = True
            return response
        result = await race_disconnect(request, _run_whole(request, job), stop)
        return JSONResponse(result)
    except ClientGone:
        return Response(status_code=499)  # nobody reads it; logged and counted as such
    finally:
        if not handed_off:
            release()


async def _run_whole(request: Request, job: Job) -> dict[str, Any]:
    try:
        return await choices.run_whole(request.app.state.router, job)
    except CoreError as exc:
        raise from_core_error(exc, job.prompt_param) from None


async def _start_stream(
    request: Request, job: Job, on_close: Callable[[], None], stop: Stop
) -> Response:
    """Wait for the first core event (honest TTFT), then hand the rest to the SSE response."""
    events = choices.events_of(request.app.state.router, job)
    sent = time.perf_counter()
    asyncio.get_running_loop().call_soon(job.answer.prepare)  # once the request is on its way
    try:
        timeout = request.app.state.settings.first_event_timeout
        first = await first_event(request, events, stop, timeout)
    except CoreError as exc:
        await events.aclose()  # type: ignore[attr-defined]
        raise from_core_error(exc, job.prompt_param) from None
    except BaseException:
        await events.aclose()  # type: ignore[attr-defined]
        raise
    ev = first[1]
    if isinstance(ev, p.EosEvent | p.CompletionEvent) and (err := end_error(ev, job.prompt_param)):
        await events.aclose()  # type: ignore[attr-defined]
        raise err
    arrived, got = getattr(request.state, "uma_arrival", sent), time.perf_counter()

    def observe() -> None:
        gateway_s = (sent - arrived) + (time.perf_counter() - got)
        request.app.state.metrics.added_latency.observe(gateway_s)

    return sse_response(job, first, events, on_close, on_first_sent=observe, stop=stop)
