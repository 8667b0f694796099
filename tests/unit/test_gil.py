"""Quick llama.cpp getters keep the GIL (core/runtime/gil.py): a thread waiting for the GIL
gets no turn while the engine thread calls them."""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable

import llama_cpp as ll

from uma_serve.core.runtime.gil import held


def _turns_while(call: Callable[[], object]) -> int:
    """How far a spinning thread gets while ``call`` runs five times."""
    count, stop = [0], threading.Event()

    def spin() -> None:
        while not stop.is_set():
            count[0] += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.05)  # no forced switch within five quick calls
    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        while count[0] == 0:  # the spinner runs and waits for the GIL from here on
            pass
        before = count[0]
        for _ in range(5):
            call()
        return count[0] - before
    finally:
        stop.set()
        spinner.join()
        sys.setswitchinterval(interval)


class _Usleep:
    """libc's usleep as a llama_cpp binding would describe it (libllama's handle finds it):
    a call long enough for a waiting thread to take the GIL when it is released."""

    __name__ = "usleep"
    argtypes = [ctypes.c_uint]
    restype = ctypes.c_int


def test_a_held_call_keeps_the_gil_and_a_plain_ctypes_call_does_not() -> None:
    assert held(ll.llama_max_devices)() == ll.llama_max_devices()  # the signature is kept
    quick = held(_Usleep())
    assert _turns_while(lambda: quick(1000)) == 0
    plain = ctypes.CDLL(None).usleep
    assert _turns_while(lambda: plain(1000)) > 0  # ctypes hands the GIL over
