"""Turning core events into OpenAI answers: SSE chunks, whole responses, disconnect races.

The rules that matter: a stream's first chunk leaves only once a real token exists (honest
TTFT, and an early error is still a real HTTP status); one chunk per token event; the finish
reason rides on the last chunk; ``include_usage`` adds a chunk with empty ``choices``; the
stream ends with ``data: [DONE]``. A client that goes away cancels its core request at once,
streamed or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, TypeVar

import msgspec
from sse_starlette.event import ensure_bytes
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request

from uma_serve.clients.client import CoreError
from uma_serve.core import protocol as p
from uma_serve.gateway.errors import ApiError, from_core_error
from uma_serve.gateway.logprobs import chat_logprobs, text_logprobs

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


@dataclass
class Job:
    """One OpenAI request on its way through the core."""

    kind: Literal["text", "chat"]
    id: str
    model: str
    generate: p.Generate
    include_usage: bool = False
    echo: str = ""
    prompt_param: str = "prompt"
    n: int = 1  # choices: n > 1 runs n core requests (gateway/choices.py)
    created: int = field(default_factory=lambda: int(time.time()))
    _frames: dict[int, tuple[bytes, bytes]] = field(default_factory=dict, repr=False)
    _offsets: dict[int, int] = field(default_factory=dict, repr=False)  # text_offset per choice

    @property
    def object(self) -> str:
        return "text_completion" if self.kind == "text" else "chat.completion"

    def chunk(self, choices: list[dict[str, Any]], usage: dict | None = None) -> str:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "text_completion" if self.kind == "text" else "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = usage
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"))

    def _frame(self, index: int) -> tuple[bytes, bytes]:
        """A content chunk's SSE bytes before and after its text, built once per choice."""
        frame = self._frames.get(index)
        if frame is None:
            marker = "\x00"
            whole = self.chunk([self.delta(marker, index=index)])
            head, tail = whole.split(json.dumps(marker), 1)
            frame = self._frames[index] = (b"data: " + head.encode(), tail.encode() + b"\n\n")
        return frame

    @cached_property
    def role_event(self) -> bytes:
        """A chat stream's opening SSE event (the assistant role, no content yet)."""
        return self.role_event_at(0)

    def role_event_at(self, index: int) -> bytes:
        if self.kind != "chat":
            return b""
        return f"data: {self.chunk([self.delta('', role=True, index=index)])}\n\n".encode()

    def prepare(self) -> None:
        """Build the per-stream templates ahead of the first token: scheduled to run while the
        core prefills, so none of it is on the TTFT path."""
        for index in range(self.n):
            self._frame(index)
        _ = self.role_event

    def content_event(self, text: str, index: int = 0, lp: p.Logprobs | None = None) -> bytes:
        """One token's whole SSE event: the hot path, so only the text is encoded per token
        (with log-probabilities asked for, the chunk is built whole)."""
        if lp is not None:
            block = self.logprobs_block([lp], index)
            return f"data: {self.chunk([self.delta(text, index=index, lp=block)])}\n\n".encode()
        head, tail = self._frame(index)
        return head + msgspec.json.encode(text) + tail

    def logprobs_block(self, lps: list[p.Logprobs], index: int = 0) -> dict[str, Any]:
        """OpenAI's ``logprobs`` object for these tokens of choice ``index``."""
        if self.kind == "chat":
            return chat_logprobs(lps)
        block, self._offsets[index] = text_logprobs(lps, self._offsets.get(index, 0))
        return block

    def delta(
        self,
        text: str | None,
        finish: str | None = None,
        role: bool = False,
        index: int = 0,
        lp: dict | None = None,
    ) -> dict:
        if self.kind == "text":
            return {"text": text or "", "index": index, "logprobs": lp, "finish_reason": finish}
        d: dict[str, Any] = {}
        if role:
            d["role"] = "assistant"
        if text is not None:
            d["content"] = text
        return {"index": index, "delta": d, "logprobs": lp, "finish_reason": finish}

    def choice(
        self, index: int, text: str, reason: str, lps: list[p.Logprobs] | None = None
    ) -> dict[str, Any]:
        text = self.echo + text
        block = self.logprobs_block(lps, index) if lps is not None else None
        if self.kind == "text":
            return {"text": text, "index": index, "logprobs": block, "finish_reason": reason}
        return {
            "index": index,
            "message": {"role": "assistant", "content": text, "refusal": None},
            "logprobs": block,
            "finish_reason": reason,
        }

    def whole(self, *result: Any) -> dict[str, Any]:
        return self.whole_n([result])  # type: ignore[list-item]

    def whole_n(self, results: list[Result]) -> dict[str, Any]:
        """The whole answer from each choice's (text, finish reason, usage, logprobs)."""
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [self.choice(i, r[0], r[1], r[3]) for i, r in enumerate(results)],
            "usage": usage_dict(total_usage([r[2] for r in results])),
        }

    def generates(self) -> list[p.Generate]:
        """The core requests: the one Generate, or n with their own ids (and seeds, so the
        choices differ yet stay reproducible)."""
        if self.n == 1:
            return [self.generate]
        seed = self.generate.seed
        return [
            msgspec.structs.replace(
                self.generate,
                id=f"{self.id}-{i}",
                seed=None if seed is None else (seed + i) % (1 << 32),
            )
            for i in range(self.n)
        ]


# a core request's end: text, finish reason, usage, log-probabilities (None unless asked)
Result = tuple[str, str, p.Usage, list[p.Logprobs] | None]


def total_usage(usages: list[p.Usage]) -> p.Usage:
    """n choices share one prompt (counted once, as OpenAI does); their completions add up."""
    completion = sum(u.completion_tokens for u in usages)
    return p.Usage(prompt_tokens=usages[0].prompt_tokens, completion_tokens=completion)


def usage_dict(u: p.Usage) -> dict[str, int]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    }


def end_error(job: Job, ev: p.EosEvent | p.CompletionEvent) -> ApiError | None:
    """An end that is not a normal finish (cancelled by the core, runtime error) as an error."""
    if ev.reason in ("stop", "length"):
        return None
    detail = ev.detail or f"generation ended with reason {ev.reason!r}"
    if ev.reason == "cancelled":
        return from_core_error(CoreError(p.E_SHUTDOWN, detail), job.prompt_param)
    return ApiError(500, detail, type="server_error", code=p.E_RUNTIME)


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def race_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` unless the client disconnects first; then cancel it, raise ClientGone.

    Cancelling the work runs the client library's cleanup, which sends ``cancel`` to the core.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise ClientGone
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()


async def first_event(request: Request, events: AsyncIterator[p.Event]) -> p.Event:
    """The stream's first event, awaited on this task itself (the TTFT path: no wrapper task,
    no asyncio.wait). A watcher cancels this task if the client disconnects first, which
    becomes ClientGone; it starts ``WATCH_AFTER_S`` later, while the core works, so creating
    it is not on the path of a request to the core."""
    task = asyncio.current_task()
    assert task is not None
    gone = False
    watcher: asyncio.Task | None = None

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
        if not gone:
            raise
        task.uncancel()
        raise ClientGone from None
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()


async def collect(job: Job, events: AsyncIterator[p.Event]) -> Result:
    """Run a non-streamed core request to its end."""
    parts: list[str] = []
    lps: list[p.Logprobs] = []
    async for ev in events:
        if isinstance(ev, p.TokenEvent):
            parts.append(ev.text)
            if ev.logprobs is not None:
                lps.append(ev.logprobs)
        elif isinstance(ev, p.CompletionEvent | p.EosEvent):
            if err := end_error(job, ev):
                raise err
            if isinstance(ev, p.CompletionEvent):
                return ev.text, ev.reason, ev.usage, ev.logprobs
            asked = job.generate.logprobs is not None
            return "".join(parts), ev.reason, ev.usage, lps if asked else None
    raise ApiError(500, "the core ended the request without a final event", type="server_error")


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


def sse_response(
    job: Job,
    first: p.Event,
    events: AsyncIterator[p.Event],
    on_close: Callable[[], None],
    on_first_sent: Callable[[], None] | None = None,
) -> EventSourceResponse:
    """The stream, starting from an already received first event."""
    closed = False

    async def cleanup() -> None:
        """Idempotent: close the core stream (which sends ``cancel`` if unfinished), once."""
        nonlocal closed
        if closed:
            return
        closed = True
        try:
            with contextlib.suppress(Exception):
                await events.aclose()  # type: ignore[attr-defined]
        finally:
            on_close()

    async def body() -> AsyncIterator[str]:
        ev: p.Event | None = first
        sent_any = False
        try:
            while ev is not None:
                if isinstance(ev, p.TokenEvent):
                    text = ev.text
                    if not sent_any:  # the role delta and the first text, in one write
                        sent_any = True
                        yield job.role_event + job.content_event(job.echo + text, 0, ev.logprobs)
                        ev = await anext(events, None)
                        continue
                    yield job.content_event(text, 0, ev.logprobs)
                elif isinstance(ev, p.EosEvent | p.CompletionEvent):
                    if err := end_error(job, ev):
                        yield json.dumps(err.body())
                        return
                    if not sent_any and job.kind == "chat":
                        yield job.chunk([job.delta("", role=True)])
                    tail = job.echo if not sent_any else ""
                    yield job.chunk([job.delta(tail if job.kind == "text" else None, ev.reason)])
                    if job.include_usage:
                        yield job.chunk([], usage_dict(ev.usage))
                    yield "[DONE]"
                    return
                ev = await anext(events, None)
            yield json.dumps(ApiError(500, "the core ended the stream early").body())
        except CoreError as exc:
            yield json.dumps(from_core_error(exc, job.prompt_param).body())
        finally:
            await cleanup()

    return GuardedEventSource(body(), job.id, cleanup=cleanup, on_first_sent=on_first_sent)
