"""A small pool of multiplexed core connections that heal themselves.

Each AsyncUmaClient carries many requests at once, so a handful of connections is enough;
spreading requests over a few keeps one slow reader from delaying everyone. A connection that
closed (core restarted, idle timeout, crash) is replaced lazily on next use, so the gateway
survives a core restart without being restarted itself.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, TypeVar

from uma_serve.clients.client import E_BAD_REPLY, AdminRequest, AsyncUmaClient, CoreError
from uma_serve.core import protocol as p
from uma_serve.gateway.errors import E_CONNECT

log = logging.getLogger("uma.gateway")
E = TypeVar("E", bound=p.Event)


class CorePool:
    def __init__(
        self,
        socket_path: str,
        size: int = 4,
        connect_timeout: float = 2.0,
        admin_timeout: float = 5.0,
        info_ttl: float = 5.0,
    ) -> None:
        self.socket_path = socket_path
        self.size = max(1, size)
        self.connect_timeout = connect_timeout
        self.admin_timeout = admin_timeout
        self.info_ttl = info_ttl
        self._slots: list[AsyncUmaClient | None] = [None] * self.size
        self._locks = [asyncio.Lock() for _ in range(self.size)]
        self._next = itertools.cycle(range(self.size))
        self._info: p.InfoEvent | None = None
        self._info_at = 0.0
        self._info_refresh: asyncio.Task | None = None
        self._down = False  # the last connect failed (logged once until one succeeds)

    async def client(self) -> AsyncUmaClient:
        """A live connection (round robin), reconnecting its slot if it closed."""
        i = next(self._next)
        current = self._slots[i]
        if current is not None and not current.closed:
            return current
        async with self._locks[i]:
            current = self._slots[i]
            if current is not None and not current.closed:
                return current
            try:
                fresh = await asyncio.wait_for(
                    AsyncUmaClient.connect(self.socket_path), self.connect_timeout
                )
            except (OSError, TimeoutError) as exc:
                raise self._unreachable(exc) from None
            self._slots[i] = fresh
            self._down = False
            self._info = None  # the core may have restarted with another model
            return fresh

    def _unreachable(self, exc: OSError | TimeoutError) -> CoreError:
        """The client's error names no path (the socket's is the operator's business: it
        goes to the log, once per outage)."""
        reason = "timed out" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        if not self._down:
            self._down = True
            log.warning("cannot connect to the core at %s: %s", self.socket_path, reason)
        return CoreError(E_CONNECT, f"cannot connect to the core: {reason}")

    async def warm(self) -> None:
        """Open every connection and fetch the info at start-up, so the first requests do not
        pay for them (best effort: a core that is not up yet is met by requests as usual)."""
        try:
            for _ in range(self.size):
                await self.client()
            await self._fetch_info()
        except CoreError as exc:
            log.info("core not reachable at start-up: %s", exc.message)

    async def ask(self, request: AdminRequest, answer: type[E]) -> E:
        """One admin request on a pooled connection, and its answer, of type ``answer``."""
        client = await self.client()
        what = request.__struct_config__.tag
        try:
            reply = await asyncio.wait_for(client.ask(request), self.admin_timeout)
        except TimeoutError:
            raise CoreError(E_CONNECT, f"the core did not answer {what} in time") from None
        if not isinstance(reply, answer):
            raise CoreError(E_BAD_REPLY, f"the core answered {what} with {type(reply).__name__}")
        return reply

    async def info(self) -> p.InfoEvent:
        """The core's info (routes read it on every request). Fetched once per connection to
        a core; after ``info_ttl`` the cached one still answers while a fresh one is fetched
        in the background, so no request waits for that round trip."""
        if self._info is None:
            return await self._fetch_info()
        if time.monotonic() - self._info_at > self.info_ttl and self._info_refresh is None:
            self._info_refresh = asyncio.ensure_future(self._refresh_info())
        return self._info

    @property
    def cached_info(self) -> p.InfoEvent | None:
        """The info last fetched (None before any, or since a reconnect): asks nothing."""
        return self._info

    async def fresh_info(self) -> p.InfoEvent:
        """The core's info asked now (a round trip): raises CoreError while it is down."""
        return await self._fetch_info()

    async def _fetch_info(self) -> p.InfoEvent:
        self._info, self._info_at = await self.ask(p.InfoRequest(), p.InfoEvent), time.monotonic()
        return self._info

    async def _refresh_info(self) -> None:
        try:
            await self._fetch_info()
        except CoreError:
            pass  # the core is away: requests meet that on their own connection
        finally:
            self._info_refresh = None

    async def health(self) -> p.HealthEvent:
        return await self.ask(p.HealthRequest(), p.HealthEvent)

    async def metrics(self) -> dict[str, Any]:
        return (await self.ask(p.MetricsRequest(), p.MetricsEvent)).metrics

    async def stream(self, request: p.Generate) -> AsyncIterator[p.Event]:
        """The request's events; one retry on a fresh connection if the first send failed.

        A pooled connection may have been closed by the core (idle timeout, restart) just
        before use: if nothing came back yet and the connection is gone, resend once.
        """
        for attempt in (0, 1):
            client = await self.client()
            got_any = False
            try:
                try:
                    async with aclosing(client.stream(request)) as events:
                        async for event in events:
                            got_any = True
                            yield event
                    return
                except ConnectionError as lost:  # a write to a core that went away
                    raise CoreError(p.E_IO, f"connection to the core lost ({lost})") from None
            except CoreError as exc:
                if got_any or attempt == 1 or exc.code != p.E_IO or not client.closed:
                    raise

    async def stream_group(self, request: p.Generate) -> AsyncIterator[tuple[int, p.Event]]:
        """A request with ``n`` > 1: its sequences' events, tagged with their index (on one
        connection: the core admits the n together)."""
        client = await self.client()
        try:
            async with aclosing(client.stream_group(request)) as events:
                async for item in events:
                    yield item
        except ConnectionError as lost:  # a write to a core that went away
            raise CoreError(p.E_IO, f"connection to the core lost ({lost})") from None

    async def close(self) -> None:
        if self._info_refresh is not None:
            self._info_refresh.cancel()
        for i, client in enumerate(self._slots):
            if client is not None:
                await client.close()
            self._slots[i] = None
