"""n > 1: several choices for one OpenAI request, each its own core request (its own
sequence; the core computes the shared prompt once and copies its KV), answered as one
response.

The n core streams are merged into one stream of (choice index, event), which
streaming.sse_response answers as it does a single one; closing the merged stream (client
gone, error) cancels every core request still running.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

from uma_serve.core import protocol as p
from uma_serve.gateway.answer import Job, Result
from uma_serve.gateway.router import Router
from uma_serve.gateway.streaming import Choice, collect

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


async def run_whole(pool: Router, job: Job) -> dict:
    """A non-streamed answer (any n): every choice to its end, concurrently; the first
    failure cancels the others."""
    tasks = [asyncio.ensure_future(_one(pool, job, gen)) for gen in job.generates()]
    try:
        return job.whole(list(await asyncio.gather(*tasks)))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _one(pool: Router, job: Job, gen: p.Generate) -> Result:
    async with aclosing(pool.stream(gen)) as events:
        return await collect(job, events)
