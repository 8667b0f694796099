"""The engine's inbox: what the I/O thread hands the engine thread, under one Condition.

Requests, cancels and the stop order queue here; the engine thread takes them all at once
between ticks and sleeps on the Condition while there is no work (no polling, no fixed sleeps).

The inbox also holds the abort window: while the engine runs a tick that no interactive
request waits on (a long background tick, docs/POLICY.md "Quiet periods"), an interactive
arrival stops that decode at once instead of waiting for it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

import msgspec

from uma_serve.core import protocol as p
from uma_serve.core.engine.sequence import RequestKey


class Submission(msgspec.Struct, frozen=True, tag=True):
    """A request as the I/O thread hands it over: tokenized, stamped on arrival."""

    key: RequestKey
    request: p.Generate
    prompt: list[int]
    arrival_ns: int


class Cancel(msgspec.Struct, frozen=True, tag=True):
    """Cancel one request (a client's cancel)."""

    key: RequestKey


class CancelConnection(msgspec.Struct, frozen=True, tag=True):
    """Cancel every request of a connection (it closed)."""

    conn_id: int


# what the inbox carries besides the stop order: a tagged union, handled with ``match``
Op = Submission | Cancel | CancelConnection


class Inbox:
    def __init__(self, abort: Callable[[], None], clear_abort: Callable[[], None]) -> None:
        self._cond = threading.Condition()
        self._items: deque[Op] = deque()
        self._stop_reason: str | None = None
        self._abort, self._clear_abort = abort, clear_abort
        self._window_open = False
        self._interactive_waiting = False  # an interactive arrival the engine has not taken

    # ---- I/O thread ----

    def post(self, op: Op, interactive: bool = False) -> None:
        with self._cond:
            self._items.append(op)
            if interactive:
                self._interactive_waiting = True
                if self._window_open:
                    self._abort()
            self._cond.notify()

    def stop(self, reason: str) -> None:
        with self._cond:
            self._stop_reason = reason
            self._cond.notify()

    # ---- engine thread ----

    def take(
        self, busy: Callable[[], bool], on_idle: Callable[[], None]
    ) -> tuple[list[Op], str | None]:
        """Everything posted so far and the stop reason (if any); sleeps while there is
        nothing to take and ``busy()`` is false."""
        with self._cond:
            while not (self._items or self._stop_reason or busy()):
                on_idle()
                self._cond.wait()
            items = list(self._items)
            self._items.clear()
            self._interactive_waiting = False
            return items, self._stop_reason

    def open_abort_window(self) -> None:
        """Before an abortable decode; an interactive arrival not yet taken aborts it now."""
        with self._cond:
            self._window_open = True
            if self._interactive_waiting:
                self._abort()

    def close_abort_window(self) -> None:
        with self._cond:
            self._window_open = False
            self._clear_abort()
