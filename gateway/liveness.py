"""Is each core alive? A core that does not answer ``health`` within a deadline is hung.

A stopped or wedged umad still accepts connections (the kernel queues them) but answers
nothing: without this, every request sent to it waited for good. The router pings each core
every ``--health-interval`` seconds; one that misses ``--liveness-timeout`` is marked hung:
its connections are closed (what was in flight on it ends with 503, or an error chunk
mid-stream), and new requests get 503 at once, naming the core, until it answers again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from uma_serve.clients.client import CoreError
from uma_serve.gateway.errors import E_CONNECT

if TYPE_CHECKING:
    from uma_serve.gateway.router import Core

log = logging.getLogger("uma.gateway")


def hung_error(core: Core) -> CoreError:
    return CoreError(E_CONNECT, f"{core.label} is not answering ({core.why_hung})")


async def refused(error: CoreError) -> AsyncIterator:
    """An event stream that fails at once (a request to a hung core)."""
    raise error
    yield  # an async generator


async def check(core: Core, timeout: float) -> None:
    """Ping ``core`` once; mark it hung (closing its connections) or alive again."""
    try:
        await asyncio.wait_for(core.pool.health(), timeout)
    except TimeoutError:
        why = f"no answer to a health check within {timeout:g} s"
        if not core.why_hung:
            log.warning("%s looks hung: %s; its connections are closed", core.label, why)
            core.why_hung = why
            await core.pool.close()
        return
    except CoreError:
        return  # down, not hung: a connection error already fails fast, with its own reason
    if core.why_hung:
        log.warning("%s answers again", core.label)
        core.why_hung = ""
