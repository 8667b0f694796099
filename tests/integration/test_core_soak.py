"""Soak: hundreds of requests with random early disconnects and cancels; nothing is held after."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from uma_serve.clients import AsyncUmaClient, CoreError
from uma_serve.core import protocol as p

from .helpers import gen, wait_idle

N_REQUESTS = 300
WORKERS = 8


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def one(path: str, rng: random.Random, i: int) -> str:
    action = rng.choice(["complete", "complete", "cancel", "disconnect", "abandon", "nostream"])
    client = await AsyncUmaClient.connect(path)
    req = gen(f"Soak {i} {rng.random()}", max_tokens=rng.randint(1, 6), stream=action != "nostream")
    try:
        if action in ("complete", "nostream"):
            final = await client.complete(req)
            assert final.reason in ("stop", "length"), final
        elif action == "cancel":
            stream = client.stream(req)
            await anext(stream)
            await client.cancel(req.id)
            async for _ in stream:
                pass
        elif action == "disconnect":  # goes away mid-stream without a word
            stream = client.stream(req)
            await anext(stream)
            client._writer.transport.abort()
        else:  # sends and goes away before any token
            await client._send(req)
    except (CoreError, StopAsyncIteration):
        pass
    finally:
        await client.close()
    return action


def test_soak_no_leaks(umad) -> None:
    async def run(n: int, seed: int) -> list[str]:
        rng = random.Random(seed)
        sem = asyncio.Semaphore(WORKERS)

        async def guarded(i: int) -> str:
            async with sem:
                return await one(umad.socket, rng, i)

        return await asyncio.gather(*(guarded(i) for i in range(n)))

    asyncio.run(run(40, 1))  # warm-up: allocator pools, piece cache
    wait_idle(umad)
    before = rss_mb(umad.proc.pid)
    done_before = sum(umad.metrics()["requests_total"].values())
    actions = asyncio.run(run(N_REQUESTS, 2))
    m = wait_idle(umad)
    after = rss_mb(umad.proc.pid)
    assert len(actions) == N_REQUESTS and {"cancel", "disconnect", "abandon"} <= set(actions)
    assert m["kv_cells_used"] == 0 and m["active_sessions"] == 0
    assert sum(m["requests_total"].values()) - done_before == N_REQUESTS  # none lost
    assert after - before < 64, f"RSS grew from {before:.0f} MB to {after:.0f} MB"
    with umad.client() as c:
        assert isinstance(c.complete(gen("After the soak", max_tokens=3)), p.EosEvent)
