"""Shutdown on SIGTERM: stop accepting, let short work finish, end the rest with an error.

uvicorn stops accepting connections on SIGTERM and waits for running requests, then cancels
what still runs after its graceful timeout: a stream cut that way just stops, with no error
chunk and no ``[DONE]``. Here the server (``GatewayServer``) tells the app's ``Drain`` first;
requests still running ``--shutdown-grace`` seconds later are stopped by the gateway itself:
a stream gets a final ``data: {"error": {..., "code": "shutting_down"}}`` chunk then
``data: [DONE]``, a request still waiting for its answer or first token a 503
``shutting_down``; their core requests are cancelled. New generation requests meanwhile get
the same 503. uvicorn's own timeout comes ``STOP_MARGIN_S`` after the grace, time for those
last answers to leave.

A request registers a ``Stop`` while it waits (for the core, for its next token); stopping
cancels the task waiting, which the waiting code turns into its error answer. No per-token
race or extra task: between waits the registered ``Stop`` is only marked.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn

from uma_serve.gateway.errors import shutting_down

STOP_MARGIN_S = 3.0


class Stop:
    """One running request's stop handle: ``waiting`` is the task to cancel while it waits."""

    __slots__ = ("stopped", "waiting")

    def __init__(self) -> None:
        self.stopped = False
        self.waiting: asyncio.Task | None = None

    def stop(self) -> None:
        self.stopped = True
        if self.waiting is not None and not self.waiting.done():
            self.waiting.cancel()


class Drain:
    def __init__(self, grace_s: float = 5.0) -> None:
        self.grace_s = grace_s
        self.draining = False  # SIGTERM arrived: no new generation requests
        self.stopping = False  # the grace is over: running ones are stopped
        self._running: set[Stop] = set()

    def add(self) -> Stop:
        stop = Stop()
        if self.stopping:
            stop.stopped = True
        self._running.add(stop)
        return stop

    def discard(self, stop: Stop) -> None:
        self._running.discard(stop)

    def begin(self) -> None:
        """Called once, in the event loop, when the server starts shutting down."""
        if self.draining:
            return
        self.draining = True
        asyncio.get_running_loop().call_later(max(0.0, self.grace_s), self.stop_all)

    def stop_all(self) -> None:
        self.stopping = True
        for stop in list(self._running):
            stop.stop()

    def refuse_new(self) -> None:
        if self.draining:
            raise shutting_down("no new requests are taken")


class GatewayServer(uvicorn.Server):
    """uvicorn's server, telling the app's Drain when shutdown starts (before it waits)."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain

    async def shutdown(self, sockets: Any = None) -> None:
        self.drain.begin()
        await super().shutdown(sockets)
