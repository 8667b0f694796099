"""The engine's batches reach the I/O loop with one wake-up for those made before it wakes
(core/server.py ``sink``): in order, none lost, a later batch waking it again."""

from __future__ import annotations

import asyncio
import threading
from collections import deque

from uma_serve.core.server import CoreServer


def test_batches_made_before_the_loop_wakes_go_in_one_delivery_in_order() -> None:
    loop = asyncio.new_event_loop()
    server = CoreServer.__new__(CoreServer)  # only the hand-over: no runtime, no socket
    server._loop, server._outbox, server._waking = loop, deque(), False
    delivered: list[list] = []
    server.deliver = delivered.append  # type: ignore[method-assign]
    wakes = 0
    call_soon = loop.call_soon_threadsafe

    def counting(*args):  # type: ignore[no-untyped-def]
        nonlocal wakes
        wakes += 1
        return call_soon(*args)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]

    def engine(batches: list[list]) -> None:
        thread = threading.Thread(target=lambda: [server.sink(b) for b in batches])
        thread.start()
        thread.join()

    engine([[(1, "a")], [(1, "b"), (2, "c")], [(2, "d")]])  # three ticks, the loop asleep
    loop.run_until_complete(asyncio.sleep(0))
    assert wakes == 1 and delivered == [[(1, "a"), (1, "b"), (2, "c"), (2, "d")]]
    engine([[(1, "e")]])  # after the delivery: woken again
    loop.run_until_complete(asyncio.sleep(0))
    assert wakes == 2 and delivered[-1] == [(1, "e")]
    loop.close()
