"""llama.cpp getters called with the GIL held.

A ctypes call releases the GIL and takes it back. While another thread waits for it (a
launch thread whose llama_decode returned, the I/O thread), each release hands the GIL over
and the engine thread then waits to get it back: on an H100 host (3 streams beside a
request sent again and again, two contexts) the engine thread spent ~17% of its busy
samples signalling a waiting thread or waiting for the GIL to come back. A getter that returns at once (a pointer, a count: the tick was synchronized
before) keeps the GIL instead; calls that may take long (llama_decode, synchronize, KV
operations, a grammar's checks) still release it.
"""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp.llama_cpp as _llama

_HELD = ctypes.PyDLL(_llama._lib._name, handle=_llama._lib._handle)


def held(func: Any) -> Any:
    """``func`` (a llama_cpp ctypes function) as a call that keeps the GIL."""
    quick = getattr(_HELD, func.__name__)
    quick.argtypes, quick.restype = func.argtypes, func.restype
    return quick
