"""--deterministic: a greedy request's text does not depend on what ran before it.

Without the mode, the same greedy request could answer differently after a mixed load with
the prefix cache on (a reused prefix, a lone token and a longer KV range each take another of
ggml's attention kernels, which round differently: docs/MEMORY.md, "Reproducible greedy
output"). With it, the texts before and after a load that fills the cache, reuses prefixes
(the question's own entry and a previous answer's, whose KV was decoded token by token),
cancels and runs sampled requests are identical, and so are their log-probabilities.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from uma_serve.clients import AsyncUmaClient
from uma_serve.core import protocol as p

from .helpers import Daemon, gen, start_daemon, wait_idle

SYSTEM = (
    "You are a careful assistant for a lighthouse museum. Answer briefly and precisely. "
    "The museum opens at nine, closes at five, and offers guided tours every hour. "
) * 4
A = SYSTEM + "Question: what should a visitor bring for the tour, and why?\nAnswer:"
QUESTIONS = ["When does it open?", "Is there parking?", "Tell me a story.", "Who built it?"]


@pytest.fixture(scope="module")
def det_umad(tmp_path_factory: pytest.TempPathFactory):
    daemon = start_daemon(
        tmp_path_factory.mktemp("det"),
        "--deterministic", "on",
        "--n-ctx", "4096",
        "--prefix-cache-tokens", "2048",
        "--prefix-cache-slots", "4",
        "--max-tokens", "512",
    )  # fmt: skip
    yield daemon
    daemon.stop()


def greedy(daemon: Daemon, prompt: str) -> tuple[str, list[float]]:
    with daemon.client() as c:
        done = c.complete(gen(prompt, max_tokens=24, logprobs=1, stream=False))
    assert isinstance(done, p.CompletionEvent) and done.logprobs is not None
    return done.text, [x.token.logprob for x in done.logprobs]


def mixed_load(daemon: Daemon, answer: str, n: int = 16) -> None:
    """Three clients: prompts sharing the system prompt, continuations of the answer,
    unrelated ones; greedy and sampled; a quarter cancelled after their first token."""
    rng = random.Random(7)

    async def one(client: AsyncUmaClient, i: int) -> None:
        q, kind = rng.choice(QUESTIONS), rng.random()
        if kind < 0.35:
            prompt = A + answer[: rng.randint(1, len(answer))] + "\nQuestion: " + q
        elif kind < 0.8:
            prompt = SYSTEM + f"Question: {q}\nAnswer:"
        else:
            prompt = f"Note {i}: {q}"
        temperature = rng.choice([0.0, 0.8])
        req = gen(prompt, max_tokens=rng.randint(4, 20), temperature=temperature, seed=i)
        if rng.random() < 0.25:
            stream = client.stream(req)
            async for ev in stream:
                if isinstance(ev, p.TokenEvent):
                    await client.cancel(req.id)
                    break
            async for _ in stream:
                pass
        else:
            await client.complete(req)

    async def worker(ids: range) -> None:
        client = await AsyncUmaClient.connect(daemon.socket)
        for i in ids:
            await one(client, i)
        await client.close()

    async def run() -> None:
        await asyncio.gather(*(worker(range(w, n, 3)) for w in range(3)))

    asyncio.run(run())
    wait_idle(daemon)


def test_greedy_text_is_the_same_after_a_mixed_load(det_umad: Daemon, tmp_path: Path) -> None:
    text_a, lp_a = greedy(det_umad, A)
    b = A + text_a + "\nQuestion: is the tour long?\nAnswer:"  # reuses A's decoded answer
    text_b, lp_b = greedy(det_umad, b)
    hits = det_umad.metrics()["prefix_cache_hits_total"]
    mixed_load(det_umad, text_a)
    m = det_umad.metrics()
    assert m["prefix_cache_hits_total"] > hits + 3  # the load reused cached prefixes
    assert m["requests_total"]["cancelled"] >= 1
    assert greedy(det_umad, A) == (text_a, lp_a)
    assert greedy(det_umad, b) == (text_b, lp_b)
    log = det_umad.log()
    assert "deterministic: one request at a time" in log and "Traceback" not in log
