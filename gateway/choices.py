"""n > 1: several choices for one OpenAI request, each its own core request (its own
sequence; the core computes the shared prompt once and copies its KV), answered as one
response.

The n core streams are merged into one stream of (choice index, event); the rules of a single
stream hold per choice (the first chunk leaves once a real token exists, an error before it is
an HTTP status, the finish reason rides on each choice's last chunk), then one usage chunk and
``data: [DONE]`` once every choice has finished. Closing the merged stream (client gone, error)
cancels every core request still running.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from uma_serve.clients.client import CoreError
from uma_serve.core import protocol as p
from uma_serve.gateway.core_pool import CorePool
from uma_serve.gateway.errors import ApiError, from_core_error
from uma_serve.gateway.streaming import (
    GuardedEventSource,
    Job,
    Result,
    collect,
    end_error,
    total_usage,
    usage_dict,
)

Choice = tuple[int, p.Event]
_DONE = object()


async def merged(streams: list[AsyncIterator[p.Event]]) -> AsyncIterator[Choice]:
    """The streams' events as they come, tagged with their index; an error in any stream is
    raised here; closing this generator cancels (and so closes) every stream."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[p.Event]) -> None:
        try:
            async with aclosing(stream) as events:  # type: ignore[type-var]
                async for event in events:
                    queue.put_nowait((i, event))
            queue.put_nowait((i, _DONE))
        except Exception as exc:  # noqa: BLE001 (handed to the reader)
            queue.put_nowait((i, exc))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        live = len(tasks)
        while live:
            i, item = await queue.get()
            if item is _DONE:
                live -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def run_whole(pool: CorePool, job: Job) -> dict:
    """Every choice to its end, concurrently; the first failure cancels the others."""
    tasks = [asyncio.ensure_future(_one(pool, job, gen)) for gen in job.generates()]
    try:
        return job.whole_n(list(await asyncio.gather(*tasks)))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _one(pool: CorePool, job: Job, gen: p.Generate) -> Result:
    async with aclosing(pool.stream(gen)) as events:
        return await collect(job, events)


def sse_response(
    job: Job,
    first: Choice,
    events: AsyncIterator[Choice],
    on_close: Callable[[], None],
    on_first_sent: Callable[[], None] | None = None,
) -> GuardedEventSource:
    """The merged stream as SSE, starting from an already received first event."""
    closed = False

    async def cleanup() -> None:
        nonlocal closed
        if not closed:
            closed = True
            try:
                await events.aclose()  # type: ignore[attr-defined]
            finally:
                on_close()

    async def body() -> AsyncIterator[bytes | str]:
        started, usages = [False] * job.n, []
        item: Choice | None = first
        try:
            while item is not None:
                i, ev = item
                if isinstance(ev, p.TokenEvent):
                    head = b"" if started[i] else job.role_event_at(i)
                    text = ev.text if started[i] else job.echo + ev.text
                    started[i] = True
                    yield head + job.content_event(text, i, ev.logprobs)
                elif isinstance(ev, p.EosEvent | p.CompletionEvent):
                    if err := end_error(job, ev):
                        yield json.dumps(err.body())
                        return
                    if not started[i] and job.kind == "chat":
                        yield job.chunk([job.delta("", role=True, index=i)])
                    tail = job.echo if not started[i] and job.kind == "text" else None
                    yield job.chunk([job.delta(tail, ev.reason, index=i)])
                    usages.append(ev.usage)
                    if len(usages) == job.n:
                        if job.include_usage:
                            yield job.chunk([], usage_dict(total_usage(usages)))
                        yield "[DONE]"
                        return
                item = await anext(events, None)
            yield json.dumps(ApiError(500, "the core ended the stream early").body())
        except CoreError as exc:
            yield json.dumps(from_core_error(exc, job.prompt_param).body())
        finally:
            await cleanup()

    return GuardedEventSource(body(), job.id, cleanup=cleanup, on_first_sent=on_first_sent)
