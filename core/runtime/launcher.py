"""A runtime's launch thread: it runs the context's llama_decode calls, which release the GIL,
so the engine thread's Python work for other contexts overlaps llama_decode's own host work
(the batch checks, the attention mask). The runtime waits for a launch to return before any
other call on its context (``landed`` in kv_memory.py).

The hand-offs are bare locks (acquired and released in C): once its llama_decode returns the
thread needs the GIL only to store the result and release a lock, and each time it takes the
GIL the engine thread waits for it. (A thread pool's futures and events ran Python on this
thread after every decode: a condition, its waiters, the pool's queue.)
"""

from __future__ import annotations

import threading
from typing import Any

import llama_cpp as ll


class Launcher:
    def __init__(self) -> None:
        self._go = _taken()  # released: a decode to run (or, with no arguments, an exit)
        self._begun = _taken()  # released by the thread on its way into llama_decode
        self._done = _taken()  # released once llama_decode returned
        self._args: tuple[Any, Any] | None = None
        self._rc = 0
        self._error: BaseException | None = None
        # started at the first launch, from the engine thread (whose niceness it takes)
        self._thread: threading.Thread | None = None

    def start(self, ctx: Any, batch: Any) -> Launcher:
        """llama_decode(ctx, batch) on the thread; returns once it has begun: the thread needs
        the GIL to get there, which the caller would otherwise keep for up to the switch
        interval (5 ms) of Python work. ``result`` waits for its return."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="uma-launch", daemon=True)
            self._thread.start()
        self._args = (ctx, batch)
        self._go.release()
        self._begun.acquire()
        return self

    def result(self) -> int:
        """The launched llama_decode's rc, once it returned (each launch's result once)."""
        self._done.acquire()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return self._rc

    def _run(self) -> None:  # on the launch thread
        while True:
            self._go.acquire()
            args = self._args
            if args is None:
                return
            self._begun.release()
            try:
                self._rc = ll.llama_decode(*args)
            except BaseException as e:  # reaches the caller of result()
                self._error = e
            self._done.release()

    def close(self) -> None:
        """Let the thread exit (no launch may be pending: the runtime waits for it first)."""
        if self._thread is not None:
            self._args = None
            self._go.release()
            self._thread.join()
            self._thread = None


def _taken() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock
