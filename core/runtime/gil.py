"""Calls the engine thread makes with the GIL held.

Each ctypes call, np.arange and 2-D numpy gather lets the GIL go and takes it back. When
another thread waits for the GIL (a launch thread whose llama_decode returned, the I/O
thread woken to write), every such release wakes it (a futex syscall, ~20 us on an H100
host's VM) and it rarely gets the GIL, since its wait starts over at each wake-up. py-spy on
an H100 host (3 streams and a request sent again and again, two contexts): 35% of the engine
thread's busy samples were in those wake-ups and in waiting to get the GIL back. A getter
that returns at once (a pointer, a count: the tick was synchronized before) keeps the GIL;
calls that may take long (llama_decode, synchronize, KV operations, a grammar's checks)
still release it.
"""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp.llama_cpp as _llama
import numpy as np

_HELD = ctypes.PyDLL(_llama._lib._name, handle=_llama._lib._handle)


# ctypes.memmove's own binding releases the GIL
memmove = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(
    ctypes._memmove_addr  # type: ignore[attr-defined]
)


def held(func: Any, restype: Any = None) -> Any:
    """``func`` (a llama_cpp ctypes function) as a call that keeps the GIL; ``restype``
    overrides its result's type (``c_void_p``: a pointer as a plain int, no pointer object)."""
    quick = _HELD[func.__name__]  # a function object of its own: its types are ours to set
    quick.argtypes, quick.restype = func.argtypes, restype or func.restype
    return quick


_COUNT = np.arange(4096)
_COUNT.flags.writeable = False


def count(n: int) -> np.ndarray:
    """0..n-1 as a read-only view for the sizes a tick uses: np.arange lets the GIL go."""
    return _COUNT[:n] if n <= len(_COUNT) else np.arange(n)
