"""n > 1: several choices for one OpenAI request, each its own core sequence (the core
computes the shared prompt once and copies its KV), answered as one response.

The n sequences go to the core as one request with ``n`` (docs/PROTOCOL.md): the core admits
all of them or none, so two such requests cannot each hold part of ``--max-sessions`` and
both be refused. Their events come back as one stream of (choice index, event), which
streaming.sse_response answers as it does a single one; closing it (client gone, error)
cancels every sequence still running.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from uma_serve.core import protocol as p
from uma_serve.gateway.answer import Job
from uma_serve.gateway.router import Router
from uma_serve.gateway.streaming import Choice, collect


def merged(pool: Router, job: Job) -> AsyncIterator[Choice]:
    """The job's n sequences' events as they come, tagged with their index; an error in any
    is raised here."""
    return pool.stream_group(job.group())


async def run_whole(pool: Router, job: Job) -> dict:
    """A non-streamed answer (any n): every choice to its end; the first failure cancels
    the others."""
    if job.n == 1:
        async with aclosing(pool.stream(job.generate)) as events:
            return job.whole([await collect(job, events)])
    by_choice: list[list[p.Event]] = [[] for _ in range(job.n)]
    async with aclosing(merged(pool, job)) as events:
        async for i, event in events:
            by_choice[i].append(event)
    return job.whole([await collect(job, _replay(evs)) for evs in by_choice])


async def _replay(events: list[p.Event]) -> AsyncIterator[p.Event]:
    for event in events:
        yield event
