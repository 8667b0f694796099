"""Several cores behind one gateway: which core takes a request, and what happens when one dies.

``uma-gateway --core-socket A --core-socket B`` keeps one ``CorePool`` per core. A request goes
to the core its *affinity key* ranks first (rendezvous hashing: each core scores
hash(core, key), the highest wins), so a conversation's turns meet the prefix cache that holds
their start. The key is the session's (``X-Session-Id`` header, else the OpenAI ``user`` field),
else the first ``--affinity-chars`` characters of the prompt or of the chat messages.

- Load: when the preferred core holds more than ``--balance-slack`` requests in flight beyond
  the least-loaded live core, the least-loaded one takes the request instead.
- Health: every ``--health-interval`` seconds each core is asked ``health``; a core that does
  not answer ``ok`` (or whose connection failed on a request) is out of the ranking, so only
  its own keys move (to their second choice); they come back once it answers again.
- Failure: a request whose core fails before the first event came back (connection lost,
  core shutting down or full) is sent to the next core in its ranking; after the first token
  the stream ends with an error naming the core (it is not replayed elsewhere).

With one core the router adds nothing on a request's path: it hands out that core's pool.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import itertools
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Literal

from uma_serve.clients.client import AdminRequest, CoreError
from uma_serve.core import protocol as p
from uma_serve.gateway import liveness
from uma_serve.gateway.core_pool import CorePool, E
from uma_serve.gateway.errors import E_CONNECT
from uma_serve.gateway.prom import CoreSnapshot

log = logging.getLogger("uma.gateway")

Routing = Literal["affinity", "round-robin"]
SESSION_HEADER = b"x-session-id"
CORE_HEADER = b"x-uma-core"
# failures before the first event that another core may well not have
RETRY_CODES = frozenset({E_CONNECT, p.E_IO, p.E_FRAME, p.E_IDLE, p.E_SHUTDOWN, p.E_BUSY})
# failures that say the core is gone or going: out of the ranking until health says ok
DOWN_CODES = frozenset({E_CONNECT, p.E_IO, p.E_FRAME, p.E_SHUTDOWN})


@dataclass
class RouteNote:
    """One HTTP request's routing facts: its session key in, the core that answered out."""

    session: str | None = None
    core: str | None = None
    cores: frozenset[str] | None = None  # those serving the model it names; None: any


NOTE: contextvars.ContextVar[RouteNote | None] = contextvars.ContextVar("uma_route", default=None)


def note_session(user: str | None) -> None:
    """The OpenAI ``user`` field as the session key, unless X-Session-Id gave one."""
    note = NOTE.get()
    if note is not None and note.session is None and user:
        note.session = user


def affinity_key(gen: p.Generate, session: str | None, chars: int) -> bytes:
    """What a request is routed by: its session key; else, for a chat, its messages up to and
    including the first user message (each cut at ``chars``): the same conversation at every
    turn, while chats that share only a system prompt spread; else the prompt's start."""
    if session:
        return b"s\x00" + session.encode()
    if gen.prompt is not None:
        return b"p\x00" + gen.prompt[:chars].encode()
    parts = []
    for m in gen.messages or ():
        parts.append(f"{m.role}\x00{m.content[:chars]}\x01")
        if m.role == "user":
            break
    return b"m\x00" + "".join(parts).encode()


def score(core: str, key: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(core.encode() + b"\x00" + key, digest_size=8).digest())


def rank(key: bytes, names: Sequence[str]) -> list[str]:
    """Rendezvous hashing: the cores in the key's order of preference. Removing a core moves
    only the keys that ranked it first; the others keep their core."""
    return sorted(names, key=lambda name: score(name, key), reverse=True)


@dataclass
class Core:
    name: str  # its socket path: the `core` label and the X-UMA-Core header
    pool: CorePool
    up: bool = True  # until a health check or a request says otherwise
    inflight: int = 0  # requests of this gateway on it now
    why_down: str = field(default="", repr=False)
    label: str = "core 0"  # its name in error messages (which, unlike name, clients see)
    why_hung: str = ""  # why the liveness check holds it hung (gateway/liveness.py); "": alive


class Router:
    """The cores and the choice among them; pool-like (``info``, ``stream``) for the routes."""

    def __init__(
        self,
        sockets: Sequence[str],
        *,
        pool_size: int = 4,
        routing: Routing = "affinity",
        affinity_chars: int = 512,
        balance_slack: int = 4,
        health_interval: float = 2.0,
        routed: Any = None,
        liveness_timeout: float = 5.0,
    ) -> None:
        if not sockets:
            raise ValueError("at least one core socket is needed")
        if len(set(sockets)) != len(sockets):
            raise ValueError("a core socket is given twice")
        self.cores = [
            Core(s, CorePool(s, size=pool_size), label=f"core {i}") for i, s in enumerate(sockets)
        ]
        self.liveness_timeout = liveness_timeout
        self.by_name = {c.name: c for c in self.cores}
        self.single = self.cores[0].pool if len(self.cores) == 1 else None
        self.routing = routing
        self.affinity_chars = affinity_chars
        self.balance_slack = balance_slack
        self.health_interval = health_interval
        self.routed = routed  # Counter(core, reason) or None
        self._turn = itertools.count()

    # --- choosing --------------------------------------------------------------------------

    def order(self, gen: p.Generate) -> tuple[list[Core], str]:
        """The cores to try, in order, and why the first was chosen. Live cores first; those
        marked down last (a request still tries them rather than fail while one may be back)."""
        cores = self.eligible()
        live = [c for c in cores if c.up]
        down = [c for c in cores if not c.up]
        if self.routing == "round-robin":
            if live:
                k = next(self._turn) % len(live)
                live = live[k:] + live[:k]
            return live + down, "round_robin"
        note = NOTE.get()
        key = affinity_key(gen, note.session if note else None, self.affinity_chars)
        names = rank(key, [c.name for c in cores])
        ranked = [self.by_name[n] for n in names]
        live = [c for c in ranked if c.up]
        down = [c for c in ranked if not c.up]
        reason = "affinity"
        if len(live) > 1:
            least = min(live, key=lambda c: c.inflight)
            if live[0].inflight - least.inflight > self.balance_slack:
                live.remove(least)
                live.insert(0, least)
                reason = "balance"
        return live + down, reason

    def eligible(self) -> list[Core]:
        """The cores that may take the current request: with cores serving different
        models, those serving the one it names (gateway/model_routing.py); else all."""
        note = NOTE.get()
        if note is None or note.cores is None:
            return self.cores
        return [c for c in self.cores if c.name in note.cores]

    def stream(self, gen: p.Generate) -> AsyncIterator[p.Event]:
        """The request's events from the core chosen for it (see the module's docstring)."""
        if self.single is not None:
            if self.cores[0].why_hung:
                return liveness.refused(liveness.hung_error(self.cores[0]))
            return self.single.stream(gen)
        return self._stream(gen)

    def stream_group(self, gen: p.Generate) -> AsyncIterator[tuple[int, p.Event]]:
        """A request with ``n`` > 1 on one core: the first of its ranking not hung (a group
        is not moved to another core)."""
        cores = [c for c in self.order(gen)[0] if not c.why_hung] if self.single is None else []
        core = cores[0] if cores else self.eligible()[0]
        if core.why_hung:
            return liveness.refused(liveness.hung_error(core))
        note = NOTE.get()
        if note is not None:
            note.core = core.name
        return core.pool.stream_group(gen)

    async def _stream(self, gen: p.Generate) -> AsyncIterator[p.Event]:
        note = NOTE.get()
        cores, reason = self.order(gen)
        hung = [c for c in cores if c.why_hung]
        cores = [c for c in cores if not c.why_hung]  # not tried: it would hold the request
        last: CoreError | None = liveness.hung_error(hung[0]) if hung else None
        for attempt, core in enumerate(cores):
            if note is not None:
                note.core = core.name
            if self.routed is not None:
                self.routed.labels(core.name, reason if attempt == 0 else "retry").inc()
            core.inflight += 1
            started = False
            try:
                async with aclosing(core.pool.stream(gen)) as events:
                    async for event in events:
                        started = True
                        yield event
                return
            except CoreError as exc:
                if exc.code in DOWN_CODES:
                    self.mark_down(core, exc.message)
                if started and exc.code in DOWN_CODES:
                    raise CoreError(
                        exc.code,
                        f"core {core.name} failed after the answer had started ({exc.message}); "
                        "a started answer is not replayed on another core",
                    ) from None
                if started or exc.code not in RETRY_CODES:
                    raise
                last = exc
                log.info(
                    "core %s could not take %s (%s): next core",
                    core.name,
                    gen.id,
                    exc.code,
                    extra={"core": core.name},
                )
            finally:
                core.inflight -= 1
        assert last is not None
        raise CoreError(last.code, f"no core could take the request: {last.message}")

    # --- health ----------------------------------------------------------------------------

    def mark_down(self, core: Core, why: str) -> None:
        if core.up:
            log.warning(
                "core %s is out of the rotation: %s", core.name, why, extra={"core": core.name}
            )
        core.up, core.why_down = False, why

    def _mark_up(self, core: Core) -> None:
        if not core.up:
            log.warning("core %s is back in the rotation", core.name, extra={"core": core.name})
        core.up, core.why_down = True, ""

    async def _health_of(self, core: Core) -> p.HealthEvent | CoreError:
        try:
            h = await core.pool.health()
        except CoreError as exc:
            self.mark_down(core, exc.message)
            return exc
        if h.status == "ok":
            self._mark_up(core)
        else:
            self.mark_down(core, f"its health is {h.status!r}")
        return h

    async def healths(self) -> list[tuple[Core, p.HealthEvent | CoreError]]:
        """Every core's health asked now (also updates which cores are in the rotation)."""
        results = await asyncio.gather(*(self._health_of(c) for c in self.cores))
        return list(zip(self.cores, results, strict=True))

    async def warm(self) -> None:
        """Open the connections at start-up; with several cores, then watch their health."""
        await asyncio.gather(*(c.pool.warm() for c in self.cores))
        while True:
            try:
                timeout = self.liveness_timeout
                await asyncio.gather(*(liveness.check(c, timeout) for c in self.cores))
                if self.single is None:
                    await self.healths()
            except Exception as exc:  # noqa: BLE001 (the checks must go on)
                log.warning("core health check failed: %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(self.health_interval)

    # --- what the routes ask ---------------------------------------------------------------

    async def info(self) -> p.InfoEvent:
        """The model's info, from a live core of those that may take the request."""
        if self.single is not None:
            return await self.single.info()
        last: CoreError | None = None
        for core in sorted(self.eligible(), key=lambda c: not c.up):
            try:
                return await core.pool.info()
            except CoreError as exc:
                self.mark_down(core, exc.message)
                last = exc
        assert last is not None
        raise last

    async def ask(self, request: AdminRequest, answer: type[E]) -> E:
        """An admin request answered by one live core of those that may take it."""
        last: CoreError | None = None
        for core in sorted(self.eligible(), key=lambda c: not c.up):
            try:
                return await core.pool.ask(request, answer)
            except CoreError as exc:
                if exc.code not in (p.E_PROTO, p.E_LIMIT):  # the request's fault, not the core's
                    self.mark_down(core, exc.message)
                    last = exc
                    continue
                raise
        assert last is not None
        raise last

    async def fresh_infos(self) -> list[p.InfoEvent]:
        """Every live core's info asked now; CoreError when none answers."""
        results = await asyncio.gather(
            *(c.pool.fresh_info() for c in self.cores), return_exceptions=True
        )
        infos = [r for r in results if isinstance(r, p.InfoEvent)]
        if not infos:
            err = next((r for r in results if isinstance(r, CoreError)), None)
            if err is None:
                raise next(r for r in results if isinstance(r, BaseException))
            raise err
        return infos

    async def snapshots(self, timeout: float = 5.0) -> list[CoreSnapshot]:
        """Every core's metrics snapshot (None where it did not answer in time) and the model
        it serves (its cached info: no second round trip once known)."""

        async def both(core: Core) -> CoreSnapshot:
            snapshot = await core.pool.metrics()
            return CoreSnapshot(core.name, (await core.pool.info()).model, snapshot)

        async def one(core: Core) -> CoreSnapshot:
            try:
                return await asyncio.wait_for(both(core), timeout)
            except (CoreError, TimeoutError):
                return CoreSnapshot(core.name, "", None)

        return list(await asyncio.gather(*(one(c) for c in self.cores)))

    async def close(self) -> None:
        for core in self.cores:
            await core.pool.close()
