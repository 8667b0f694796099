"""A request not streamed, and n > 1: several choices for one request, each its own core
sequence (the core computes the shared prompt once and copies its KV), answered as one.

The n sequences go to the core as one request with ``n`` (docs/PROTOCOL.md): the core admits
all of them or none, so two such requests cannot each hold part of ``--max-sessions`` and
both be refused. Their events come back as one stream of (choice index, event), which
streaming.sse_response answers as it does a single one; closing it (client gone, error)
cancels every sequence still running.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from uma_serve.core import protocol as p
from uma_serve.gateway.answer import Job, Result, end_error
from uma_serve.gateway.errors import ApiError
from uma_serve.gateway.router import Router
from uma_serve.gateway.streaming import Choice, tagged


def events_of(pool: Router, job: Job) -> AsyncIterator[Choice]:
    """The job's events as they come, tagged with their choice's index; an error in any is
    raised here."""
    gen = job.generate
    return pool.stream_group(gen) if gen.n > 1 else tagged(pool.stream(gen))


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
            if err := end_error(ev, job.prompt_param):
                raise err
            if isinstance(ev, p.CompletionEvent):
                return ev.text, ev.reason, ev.usage, ev.logprobs
            asked = job.generate.logprobs is not None
            return "".join(parts), ev.reason, ev.usage, lps if asked else None
    raise ApiError(500, "the core ended the request without a final event", type="server_error")


async def run_whole(pool: Router, job: Job) -> dict[str, Any]:
    """A non-streamed answer (any n): every choice to its end; the first failure cancels
    the others."""
    n = job.generate.n
    if n == 1:
        async with aclosing(pool.stream(job.generate)) as events:
            return job.answer.whole([await collect(job, events)])
    by_choice: list[list[p.Event]] = [[] for _ in range(n)]
    async with aclosing(pool.stream_group(job.generate)) as events:
        async for i, event in events:
            by_choice[i].append(event)
    return job.answer.whole([await collect(job, _replay(evs)) for evs in by_choice])


async def _replay(events: list[p.Event]) -> AsyncIterator[p.Event]:
    for event in events:
        yield event
