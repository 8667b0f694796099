"""What the I/O thread posts to the engine thread, and the one lock they share.

``submit``/``cancel``/``stop`` post here under one Condition; the engine thread takes
everything posted at once between ticks. The inbox also holds the abort window, which the
engine opens around the launch of a tick that no interactive request waits on (a long
background tick, docs/POLICY.md "Quiet periods"): an interactive arrival then stops that
decode at once instead of waiting for it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import msgspec

from uma_serve.core.engine.sequence import RequestKey, Submission
from uma_serve.core.runtime.api import RuntimeApi


class Cancel(msgspec.Struct, frozen=True, tag=True):
    """Cancel one request (a client's cancel)."""

    key: RequestKey


class CancelConnection(msgspec.Struct, frozen=True, tag=True):
    """Cancel every request of a connection (it closed)."""

    conn_id: int


# what the inbox carries besides the stop order: a tagged union, handled with ``match``
Op = Submission | Cancel | CancelConnection


class Inbox:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: deque[Op] = deque()
        self._stop_reason: str | None = None
        self._abort: Callable[[], None] = _nothing  # the open window's decode's
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
            return self._drain(), self._stop_reason

    def take_ready(self) -> list[Op]:
        """What was posted since the last take, without waiting (the stop order stays)."""
        with self._cond:
            return self._drain()

    def _drain(self) -> list[Op]:  # under the lock
        items = list(self._items)
        self._items.clear()
        self._interactive_waiting = False
        return items

    @contextmanager
    def abort_window(self, abortable: bool, runtime: RuntimeApi) -> Iterator[None]:
        """Around an abortable decode's launch on ``runtime``: an interactive arrival not yet
        taken, or one posted while it runs, aborts it."""
        if not abortable:
            yield
            return
        with self._cond:
            self._window_open, self._abort = True, runtime.abort
            if self._interactive_waiting:
                self._abort()
        try:
            yield
        finally:
            with self._cond:
                self._window_open, self._abort = False, _nothing
                runtime.clear_abort()


def _nothing() -> None:
    pass
