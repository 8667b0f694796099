"""Prefix cache with the real model: a cache hit gives the same greedy output as no cache.

One daemon with the cache (a small budget, so entries are evicted during the module) and one
without; prompts share system prompts longer than Gemma 3's 512-token sliding window, so a
reused prefix is only right if the SWA layers kept every position (swa_full).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from uma_serve.clients import AsyncUmaClient
from uma_serve.core import protocol as p
from uma_serve.core.config import chat_model_path

from .helpers import Daemon, gen, start_daemon

FACTS = [
    "The lighthouse keeper logs the weather every morning at six.",
    "Ships that pass the northern reef must signal twice.",
    "The archive stores maps drawn by hand since the old harbour opened.",
    "Visitors may climb the tower on Sundays when the sea is calm.",
    "The lamp was converted from oil to electricity many years ago.",
    "Fog horns sound every thirty seconds when visibility drops.",
    "The keeper's cottage has a garden of herbs and a small orchard.",
    "Supply boats arrive on the first day of each month.",
]


def system_prompt(name: str, sentences: int = 60) -> str:
    body = " ".join(FACTS[(i * 3 + len(name)) % len(FACTS)] for i in range(sentences))
    return f"You are {name}, the assistant of the lighthouse. Rules and facts:\n{body}\n"


SYS_A = system_prompt("Ada")
SYS_B = system_prompt("Bea")
# Copying questions: their answers are clear-cut (no near-ties between the top two tokens), so
# the comparison does not hinge on the last bits of the logits. In a unified KV cache those bits
# depend on which other cells are resident, cache or not (docs/MEMORY.md); a reused KV that
# is wrong (e.g. SWA cells recycled) derails the copy. Past the quote a near tie can come up:
# see agree().
QUESTIONS = [
    f"Question {i}: quote rule {i + 1} word for word.\nAnswer: {' '.join(FACTS[i].split()[:3])}"
    for i in range(8)
]
MAX_TOKENS = 12
NEAR_TIE = 1.0  # nats: how far a logit moves with where its sequence's cells sit in the KV


@dataclass(frozen=True)
class Answer:
    text: str
    tokens: list[int]
    margins: list[float]  # per step: log-probability of the greedy token minus the runner-up's


def agree(got: list[Answer], want: list[Answer]) -> bool:
    """Same greedy tokens, up to a step where both runs had their two best tokens nearly tied
    (margins summing to less than NEAR_TIE). There the last bits of the logits decide, and
    those move with the batch and the KV layout, cache or not: on an AVX-512 Xeon four
    concurrent requests without any cache ended one quote differently from the same four run
    one at a time. Past such a step the texts may part; a wrong KV flips a clear-cut token."""
    for a, b in zip(got, want, strict=True):
        pairs = zip(a.tokens, b.tokens, strict=True)  # ignore_eos: as many tokens each
        split = next((i for i, (x, y) in enumerate(pairs) if x != y), None)
        if split is not None and a.margins[split] + b.margins[split] >= NEAR_TIE:
            return False
    return True


def answer(done: p.Event) -> Answer:
    assert isinstance(done, p.CompletionEvent) and done.logprobs is not None, done
    return Answer(
        done.text,
        [lp.token.token_id for lp in done.logprobs],
        [lp.top[0].logprob - lp.top[1].logprob for lp in done.logprobs],
    )


def request(prompt: str) -> p.Generate:
    return gen(prompt, max_tokens=MAX_TOKENS, ignore_eos=True, stream=False, logprobs=2)


def _daemon(tmp: str, *extra: str) -> Daemon:
    return start_daemon(
        Path(tmp), "--n-seq", "4", "--n-ctx", "8192", "--seed", "7", "--spec-draft", "0", *extra
    )


@pytest.fixture(scope="module")
def cached() -> Iterator[Daemon]:
    with tempfile.TemporaryDirectory(prefix="uma-pc-") as tmp:
        # ~1.6 prompts' worth of budget: storing a second system prompt evicts the first
        d = _daemon(tmp, "--prefix-cache-tokens", "1400", "--prefix-cache-slots", "6")
        yield d
        d.stop()


@pytest.fixture(scope="module")
def plain() -> Iterator[Daemon]:
    with tempfile.TemporaryDirectory(prefix="uma-pc0-") as tmp:
        d = _daemon(tmp, "--prefix-cache-tokens", "0")
        yield d
        d.stop()


def complete(d: Daemon, prompt: str) -> Answer:
    with d.client() as c:
        return answer(c.complete(request(prompt)))


async def _concurrent(d: Daemon, prompts: list[str]) -> list[Answer]:
    client = await AsyncUmaClient.connect(d.socket)
    try:
        done = await asyncio.gather(*(client.complete(request(q)) for q in prompts))
    finally:
        await client.close()
    return [answer(e) for e in done]


def test_later_request_reuses_the_prefix(cached: Daemon, plain: Daemon) -> None:
    complete(cached, SYS_A + QUESTIONS[0])  # warms the cache
    before = cached.metrics()
    warm = complete(cached, SYS_A + QUESTIONS[1])
    after = cached.metrics()
    assert after["prefix_cache_hits_total"] == before["prefix_cache_hits_total"] + 1
    reused = after["prefix_cache_cached_tokens_total"] - before["prefix_cache_cached_tokens_total"]
    assert reused > 512  # beyond the sliding window
    assert after["prefix_cache_resident_tokens"] > 0
    assert agree([warm], [complete(plain, SYS_A + QUESTIONS[1])])


def test_a_model_with_no_window_reuses_a_prefix_right() -> None:
    """SmolLM2 has no sliding window, so its runtime keeps no shadow ids (docs/MEMORY.md): a
    request on a cached system prompt still answers as it does without the cache."""
    model = chat_model_path()
    with tempfile.TemporaryDirectory(prefix="uma-pcw-") as tmp:
        for sub in ("c", "p"):
            Path(tmp, sub).mkdir()
        cached = _daemon(tmp + "/c", "--model", model)
        plain = _daemon(tmp + "/p", "--model", model, "--prefix-cache-tokens", "0")
        try:
            complete(cached, SYS_A + QUESTIONS[0])  # warms the cache
            before = cached.metrics()["prefix_cache_cached_tokens_total"]
            warm = complete(cached, SYS_A + QUESTIONS[1])
            assert cached.metrics()["prefix_cache_cached_tokens_total"] - before > 512
            assert agree([warm], [complete(plain, SYS_A + QUESTIONS[1])])
        finally:
            cached.stop()
            plain.stop()


def test_four_concurrent_requests_share_the_prefix(cached: Daemon, plain: Daemon) -> None:
    complete(cached, SYS_A + QUESTIONS[0])
    prompts = [SYS_A + q for q in QUESTIONS[2:6]]
    before = cached.metrics()["prefix_cache_hits_total"]
    got = asyncio.run(_concurrent(cached, prompts))
    assert cached.metrics()["prefix_cache_hits_total"] >= before + 4
    want = [complete(plain, q) for q in prompts]
    assert agree(got, want), (got, want)


def test_eviction_under_a_small_budget_keeps_outputs_right(cached: Daemon, plain: Daemon) -> None:
    order = [SYS_B + QUESTIONS[0], SYS_A + QUESTIONS[6], SYS_B + QUESTIONS[1], SYS_A + QUESTIONS[7]]
    got = [complete(cached, q) for q in order]
    m = cached.metrics()
    assert m["prefix_cache_resident_tokens"] <= 1400
    want = [complete(plain, q) for q in order]
    assert agree(got, want), (got, want)


def test_a_cancelled_requests_prefix_stays_usable(cached: Daemon, plain: Daemon) -> None:
    sys_c = system_prompt("Cyd")
    with cached.client() as c:
        req = gen(sys_c + QUESTIONS[0], max_tokens=200, ignore_eos=True)
        for event in c.stream(req):
            if isinstance(event, p.TokenEvent):
                c.send(p.Cancel(id=req.id))
                break
        for event in iter(c.read_event, None):
            if isinstance(event, p.EosEvent):
                assert event.reason in ("cancelled", "length")
                break
    before = cached.metrics()
    warm = complete(cached, sys_c + QUESTIONS[3])
    after = cached.metrics()
    reused = after["prefix_cache_cached_tokens_total"] - before["prefix_cache_cached_tokens_total"]
    assert reused > 512
    assert agree([warm], [complete(plain, sys_c + QUESTIONS[3])])


def test_pinned_prefix_is_restored_after_a_restart(plain: Daemon, tmp_path: Path) -> None:
    pin = tmp_path / "system.txt"
    sys_d = system_prompt("Dot")
    pin.write_text(sys_d)
    outputs, logs = [], []
    for run in range(2):
        (tmp_path / f"run{run}").mkdir()
        d = _daemon(str(tmp_path / f"run{run}"), "--pin-prefix", str(pin))
        try:
            outputs.append(complete(d, sys_d + QUESTIONS[2]))
            m = d.metrics()
            assert m["prefix_cache_hits_total"] == 1
            assert m["prefix_cache_cached_tokens_total"] > 512
        finally:
            d.stop()
        logs.append(d.log())
    assert "computed" in logs[0] and "loaded" in logs[1]
    assert agree(outputs, [outputs[1], complete(plain, sys_d + QUESTIONS[2])])


def test_concurrent_requests_share_a_prefix_still_being_computed(
    cached: Daemon, plain: Daemon
) -> None:
    """Four requests arrive together with a system prompt nobody computed yet: one computes
    it, the other three wait and copy its KV from the running sequence (n choices of one
    request, agents started at once). Same greedy text as without the cache. (Last in the
    module: the cells it leaves resident would change the near-tie bits the earlier
    comparisons rest on.)"""
    prompts = [system_prompt("Eve") + q for q in QUESTIONS[4:8]]
    before = cached.metrics()
    got = asyncio.run(_concurrent(cached, prompts))
    after = cached.metrics()
    assert after["prefix_cache_hits_total"] - before["prefix_cache_hits_total"] >= 3
    reused = after["prefix_cache_cached_tokens_total"] - before["prefix_cache_cached_tokens_total"]
    assert reused > 3 * 512
    want = [complete(plain, q) for q in prompts]
    assert agree(got, want), (got, want)
