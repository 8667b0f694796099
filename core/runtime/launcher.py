"""A runtime's launch thread: it runs the context's llama_decode calls, so the engine thread's
Python work for other contexts overlaps llama_decode's own host work (the batch checks, the
attention mask). The thread is native (launch.c, built with the package): it never takes the
GIL, which a Python thread had to take to start each llama_decode and again once it returned,
each time from the engine thread. The runtime waits for a launch to return before any other
call on its context (``landed`` in kv_memory.py)."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import llama_cpp as ll

from uma_serve.core.native import library

_HELD, _RELEASED = library(Path(__file__).parent, "_launch")
_HELD.uma_launch_batch_size.restype = ctypes.c_size_t
assert _HELD.uma_launch_batch_size() == ctypes.sizeof(ll.llama_batch), "llama_batch changed"
_HELD.uma_launch_new.argtypes, _HELD.uma_launch_new.restype = [ctypes.c_void_p], ctypes.c_void_p
_start = _HELD.uma_launch_start  # copies the batch and signals: returns at once
_start.argtypes, _start.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p], None
_wait = _RELEASED.uma_launch_wait
_wait.argtypes, _wait.restype = [ctypes.c_void_p], ctypes.c_int32
_free = _RELEASED.uma_launch_free
_free.argtypes, _free.restype = [ctypes.c_void_p], None
_count = _HELD.uma_launch_count
_count.argtypes, _count.restype = [ctypes.c_void_p], ctypes.c_int64
_DECODE = ctypes.cast(ll.llama_cpp._lib.llama_decode, ctypes.c_void_p).value


class Launcher:
    def __init__(self) -> None:
        # its thread starts at the first launch, from the engine thread (whose niceness it takes)
        self._handle: int | None = None

    def start(self, ctx: Any, batch: Any) -> None:
        """llama_decode(ctx, batch) on the thread; ``result()`` waits for its rc. ``batch``'s
        arrays must stay as they are until then."""
        if self._handle is None:
            self._handle = _HELD.uma_launch_new(_DECODE)
            if not self._handle:
                raise RuntimeError("could not start a launch thread")
        _start(self._handle, ctx, ctypes.byref(batch))

    @property
    def launches(self) -> int:
        """llama_decode calls run on the thread so far."""
        return 0 if self._handle is None else int(_count(self._handle))

    def result(self) -> int:
        return int(_wait(self._handle))

    def close(self) -> None:
        if self._handle:
            _free(self._handle)
            self._handle = None
