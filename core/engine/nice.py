"""Thread priority: token compute yields to the threads that move bytes.

The engine thread raises its own nice value before its first tick; llama.cpp's OpenMP worker
threads, which it starts, inherit it, and the I/O thread keeps the process's. On a machine
whose cores the compute threads fill, a waking I/O thread, the gateway or the user's other
programs then take a core at once instead of waiting out a compute thread's slice.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("uma.engine")


def lower_current_thread(by: int) -> None:
    """Raise the calling thread's nice value by ``by`` (0: leave it). Raising needs no
    privileges; a failure is logged, not fatal."""
    if by <= 0:
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + by)
    except OSError as exc:
        log.warning("cannot lower the compute threads' priority: %s", exc)
