"""A runtime's launch thread: it runs the context's llama_decode calls, which release the GIL,
so the engine thread's Python work for other contexts overlaps llama_decode's own host work
(the batch checks, the attention mask). The runtime waits for a launch to return before any
other call on its context (``landed`` in kv_memory.py)."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import llama_cpp as ll


class Launcher:
    def __init__(self) -> None:
        # its thread starts at the first launch, from the engine thread (whose niceness it takes)
        self._pool = ThreadPoolExecutor(1, "uma-launch")
        self._started = threading.Event()  # the thread is inside llama_decode

    def start(self, ctx: Any, batch: Any) -> Future[int]:
        """llama_decode(ctx, batch) on the thread; returns once it has begun: the thread needs
        the GIL to get there, which the caller would otherwise keep for up to the switch
        interval (5 ms) of Python work."""
        self._started.clear()
        decoding = self._pool.submit(self._decode, ctx, batch)
        self._started.wait()
        return decoding

    def _decode(self, ctx: Any, batch: Any) -> int:  # on the launch thread
        self._started.set()
        return ll.llama_decode(ctx, batch)

    def close(self) -> None:
        self._pool.shutdown()
