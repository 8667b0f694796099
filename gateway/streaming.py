"""The streamed answer's plumbing: the first event awaited (honest TTFT, disconnect and stop
races), then the pump that hands every core event to the request's Answer (gateway/answer.py)
and writes the bytes it returns.

The rules that matter: a stream's first chunk leaves only once a real token exists (honest
TTFT, and an early error is still a real HTTP status); one write per token event; however the
stream ends (the core gone, the gateway stopping), the answer's own error ends it. A client
that goes away cancels its core request at once, streamed or not.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from sse_starlette.event import ensure_bytes
from sse_starlette.sse import AppStatus, EventSourceResponse
from starlette.requests import Request

from uma_serve.clients.client import CoreError
from uma_serve.core import protocol as p
from uma_serve.gateway.answer import Job, end_error
from uma_serve.gateway.drain import Stop
from uma_serve.gateway.errors import ApiError, core_timeout, from_core_error, shutting_down

# sse-starlette cancels every stream at once on SIGTERM (no final chunk); the gateway's Drain
# ends them itself, with an error chunk and [DONE] (gateway/drain.py)
AppStatus.disable_automatic_graceful_drain()

T = TypeVar("T")
WATCH_AFTER_S = 0.001  # when the disconnect watcher of a request waiting for its first token starts
# sse-starlette's headers for a text/event-stream response, sent with the first chunk before
# the EventSourceResponse (whose set-up is not on the TTFT path) exists
SSE_SEP, SSE_PING_S = "\n", 15
SSE_HEADERS = [
    (b"cache-control", b"no-store"),
    (b"connection", b"keep-alive"),
    (b"x-accel-buffering", b"no"),
    (b"content-type", b"text/event-stream; charset=utf-8"),
]


class ClientGone(Exception):
    """The HTTP client disconnected before its answer was ready."""


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def race_disconnect(request: Request, work: Awaitable[T], stop: Stop | None = None) -> T:
    """Await ``work`` unless the client disconnects first; then cancel it, raise ClientGone.
    A ``stop`` (the gateway shutting down) cancels the work too: a 503 ``shutting_down``.

    Cancelling the work runs the client library's cleanup, which sends ``cancel`` to the core.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    if stop is not None:
        stop.waiting = task
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            if stop is not None and stop.stopped and task.cancelled():
                raise shutting_down("no answer was ready in time")
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise ClientGone
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
        if stop is not None:
            stop.waiting = None


class Deadline:
    """Cancels ``task`` after ``seconds`` (0: never): a stream's wait for its first event."""

    def __init__(self, task: asyncio.Task, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(seconds, self._expire, task) if seconds > 0 else None

    def _expire(self, task: asyncio.Task) -> None:
        self.expired = True
        task.cancel()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def error(self) -> ApiError:
        return core_timeout(self.seconds)


async def first_event(
    request: Request, events: AsyncIterator[p.Event], stop: Stop | None = None, timeout: float = 0
) -> p.Event:
    """The stream's first event, awaited on this task itself (the TTFT path: no wrapper task,
    no asyncio.wait). A watcher cancels this task if the client disconnects first, which
    becomes ClientGone; it starts ``WATCH_AFTER_S`` later, while the core works, so creating
    it is not on the path of a request to the core. A ``stop`` (the gateway shutting down)
    cancels it too: a 503 ``shutting_down``; so does ``--first-event-timeout``: a 503
    ``core_timeout``."""
    task = asyncio.current_task()
    assert task is not None
    if stop is not None:
        stop.waiting = task
    gone = False
    watcher: asyncio.Task | None = None
    deadline = Deadline(task, timeout)

    async def watch() -> None:
        nonlocal gone
        await _wait_disconnect(request)
        gone = True
        task.cancel()

    def start_watching() -> None:
        nonlocal watcher
        watcher = asyncio.ensure_future(watch())

    timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, start_watching)
    try:
        return await anext(events)
    except asyncio.CancelledError:
        if gone:
            task.uncancel()
            raise ClientGone from None
        if stop is not None and stop.stopped:
            task.uncancel()
            raise shutting_down("no token was ready in time") from None
        if deadline.expired:
            task.uncancel()
            raise deadline.error() from None
        raise
    finally:
        if stop is not None:
            stop.waiting = None
        timer.cancel()
        deadline.cancel()
        if watcher is not None:
            watcher.cancel()


class GuardedEventSource(EventSourceResponse):
    """An EventSourceResponse that sends its headers and first chunk itself, at once, and
    runs ``cleanup`` however the response ends.

    sse-starlette's set-up (its __init__, then a task group for pings, disconnects and the
    rest of the stream) runs only after the first chunk is out, so none of it is on the TTFT
    path. The body generator's own ``finally`` does not run if the generator never started
    (the client left before the first send): this wrapper still frees the slot and the core
    request.
    """

    def __init__(
        self,
        body: AsyncIterator[Any],
        request_id: str,
        cleanup: Callable[[], Awaitable[None]],
        on_first_sent: Callable[[], None] | None = None,
    ) -> None:
        self.body_iterator = body
        self._request_id = request_id
        self._cleanup = cleanup
        self._on_first_sent = on_first_sent

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            try:
                first = await anext(self.body_iterator)  # type: ignore[call-overload]
                headers = [(b"x-request-id", self._request_id.encode()), *SSE_HEADERS]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                body = ensure_bytes(first, SSE_SEP)
                await send({"type": "http.response.body", "body": body, "more_body": True})
                if self._on_first_sent is not None:
                    self._on_first_sent()
            except BaseException:
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
                raise

            async def rest(message: Any) -> None:
                if message["type"] != "http.response.start":  # already sent
                    await send(message)

            super().__init__(self.body_iterator, sep=SSE_SEP, ping=SSE_PING_S)
            await super().__call__(scope, receive, rest)
        finally:
            await self._cleanup()

    async def _send_with_timeout(self, send: Any, message: Any) -> None:
        """Without a send timeout (ours has none), send at once: sse-starlette otherwise opens
        an anyio cancel scope around every chunk, about a tenth of the gateway's CPU per
        token here (py-spy). Should the library rename this hook, it simply goes unused."""
        if self.send_timeout is None:
            await send(message)
        else:
            await super()._send_with_timeout(send, message)


Choice = tuple[int, p.Event]  # (choice index, core event)
Cleanup = Callable[[], Awaitable[None]]


async def tagged(events: AsyncIterator[p.Event]) -> AsyncIterator[Choice]:
    """One core stream as choice 0's (closing this closes it)."""
    async with contextlib.aclosing(events) as stream:  # type: ignore[type-var]
        async for event in stream:
            yield 0, event


def sse_response(
    job: Job,
    first: Choice,
    events: AsyncIterator[Choice],
    on_close: Callable[[], None],
    on_first_sent: Callable[[], None] | None = None,
    stop: Stop | None = None,
) -> EventSourceResponse:
    """The stream of ``job``'s answer, from an already received first event. A ``stop`` (the
    gateway shutting down) ends it with the answer's error, as does any error (the core gone,
    its drain timed out)."""
    cleanup = _close_once(events, on_close)
    halt = stop if stop is not None else Stop()
    body = _sse_body(job, first, events, halt, cleanup)
    return GuardedEventSource(body, job.generate.id, cleanup=cleanup, on_first_sent=on_first_sent)


def _close_once(events: AsyncIterator[Choice], on_close: Callable[[], None]) -> Cleanup:
    """The stream's cleanup, run by whichever of the body and the response ends first."""
    closed = False

    async def cleanup() -> None:
        """Idempotent: close the core streams (which sends ``cancel`` if unfinished), once."""
        nonlocal closed
        if closed:
            return
        closed = True
        try:
            with contextlib.suppress(Exception):
                await events.aclose()  # type: ignore[attr-defined]
        finally:
            on_close()

    return cleanup


async def _sse_body(
    job: Job, first: Choice, events: AsyncIterator[Choice], halt: Stop, cleanup: Cleanup
) -> AsyncIterator[bytes]:
    """sse_response's bytes, from ``first`` on; ``cleanup`` runs however it ends."""
    answer, ended = job.answer, 0
    item: Choice | None = first
    try:
        if opening := answer.open():
            yield opening
        while item is not None:
            i, ev = item
            if type(ev) is p.TokenEvent:  # every token's path: one call of the answer
                if data := answer.token(ev, i):
                    yield data
            elif isinstance(ev, p.EosEvent | p.CompletionEvent):
                if err := end_error(ev, job.prompt_param):  # e.g. the core's drain timed out
                    yield answer.error(err)
                    return
                yield answer.end(ev, i)
                ended += 1
                if ended == answer.n:
                    return
            if halt.stopped:
                break
            # inline, not a helper: this is every token's path
            halt.waiting = task = asyncio.current_task()
            try:
                item = await anext(events, None)
            except asyncio.CancelledError:
                if not halt.stopped or task is None:
                    raise
                task.uncancel()  # our own stop, not the server's cancellation
                break
            finally:
                halt.waiting = None
        else:
            yield answer.error(ApiError(500, "the core ended the stream early"))
            return
        yield answer.error(shutting_down("the stream was cut short"))
    except CoreError as exc:  # e.g. the core died: the answer still ends as its API ends
        yield answer.error(from_core_error(exc, job.prompt_param))
    finally:
        await cleanup()
