"""The multi-core router's choices without a model: rendezvous ranking, the affinity key, the
load fallback, retries before the first event, and the per-core metric labels. The cores are
fakes here (pure logic); tests/integration/test_gateway_scale.py runs real ones."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from uma_serve.clients.client import CoreError
from uma_serve.core import protocol as p
from uma_serve.core.metrics import EngineMetrics
from uma_serve.gateway.errors import E_CONNECT
from uma_serve.gateway.prom import CoreSnapshot, GatewayMetrics
from uma_serve.gateway.router import NOTE, RouteNote, Router, affinity_key, rank

CORES = ["/run/a.sock", "/run/b.sock", "/run/c.sock"]


def gen(prompt: str = "hello", **kw) -> p.Generate:
    return p.Generate(id=kw.pop("id", "r1"), prompt=prompt, **kw)


def test_rank_moves_only_the_removed_cores_keys():
    keys = [f"session-{i}".encode() for i in range(300)]
    before = {k: rank(k, CORES)[0] for k in keys}
    after = {k: rank(k, CORES[:2])[0] for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == CORES[2] for k in moved)
    # every core gets a share, and a key's first choice does not depend on the list's order
    assert set(before.values()) == set(CORES)
    assert all(rank(k, CORES[::-1])[0] == before[k] for k in keys)


def test_affinity_key_prefers_the_session_then_the_prompt_start():
    assert affinity_key(gen("abc"), "s1", 2) == affinity_key(gen("xyz"), "s1", 2)
    assert affinity_key(gen("abcdef"), None, 3) == affinity_key(gen("abcxyz"), None, 3)
    assert affinity_key(gen("abcdef"), None, 4) != affinity_key(gen("abcxyz"), None, 4)
    system = p.Message(role="system", content="You are terse. " * 100)  # shared, long

    def chat(*texts: str) -> p.Generate:
        roles = ["user", "assistant"] * len(texts)
        messages = [p.Message(role=r, content=t) for r, t in zip(roles, texts, strict=False)]
        return p.Generate(id="c", messages=[system, *messages])

    # the same conversation at its first and third turn: one key; another conversation with
    # the same system prompt: another key
    first, third = chat("Plan a trip."), chat("Plan a trip.", "Where to?", "Rome.")
    assert affinity_key(first, None, 64) == affinity_key(third, None, 64)
    assert affinity_key(first, None, 64) != affinity_key(chat("Fix my code."), None, 64)


class FakePool:
    """A core that answers with two tokens, or fails with ``fail`` before or after the first."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.fail: str | None = None
        self.fail_after_first = False
        self.calls = 0

    async def stream(self, request: p.Generate) -> AsyncIterator[p.Event]:
        self.calls += 1
        if self.fail and not self.fail_after_first:
            raise CoreError(self.fail, f"{self.name} failed")
        yield p.TokenEvent(id=request.id, text=self.name, token_id=1)
        if self.fail:
            raise CoreError(self.fail, f"{self.name} failed")
        yield p.TokenEvent(id=request.id, text="!", token_id=2)

    async def health(self) -> p.HealthEvent:
        if self.fail:
            raise CoreError(E_CONNECT, "down")
        return p.HealthEvent(id=None, status="ok", active_sessions=0, waiting_sessions=0)

    async def metrics(self) -> dict:
        if self.fail:
            raise CoreError(E_CONNECT, "down")
        return {"uptime_s": 1.0}

    async def info(self) -> p.InfoEvent:
        return p.InfoEvent(None, f"model-{self.name}", "", 8, 8, 1, 8, False, "0", 8, 8)


def router(n: int = 2, **kw) -> tuple[Router, list[FakePool]]:
    r = Router(CORES[:n], **kw)
    fakes = []
    for core in r.cores:
        core.pool = FakePool(core.name)  # type: ignore[assignment]
        fakes.append(core.pool)
    return r, fakes  # type: ignore[return-value]


async def texts(r: Router, request: p.Generate, session: str | None = None) -> list[str]:
    NOTE.set(RouteNote(session=session))
    async with aclosing(r.stream(request)) as events:
        return [ev.text async for ev in events]  # type: ignore[union-attr]


def test_affinity_balance_and_round_robin_order():
    r, _ = router(3)
    first = r.order(gen())[0][0]
    assert r.order(gen())[0][0] is first  # the same key, the same core
    first.inflight = 5  # 5 more than the least loaded: over the slack of 4
    cores, reason = r.order(gen())
    assert reason == "balance" and cores[0] is not first and cores[1] is first
    first.inflight = 4
    cores, reason = r.order(gen())
    assert cores[0] is first and reason == "affinity"
    rr, _ = router(3, routing="round-robin")
    assert [rr.order(gen())[0][0].name for _ in range(3)] == CORES


def test_a_failure_before_the_first_event_goes_to_the_next_core():
    r, fakes = router(2)
    preferred = r.order(gen())[0][0]
    fake = next(f for f in fakes if f.name == preferred.name)
    fake.fail = E_CONNECT
    out = asyncio.run(texts(r, gen()))
    other = next(f for f in fakes if f is not fake)
    assert out == [other.name, "!"] and not preferred.up
    # out of the rotation: the next request goes straight to the other core
    fake.calls = 0
    assert asyncio.run(texts(r, gen()))[0] == other.name and fake.calls == 0
    # the health check brings it back, with its keys
    fake.fail = None
    asyncio.run(r.healths())
    assert preferred.up and asyncio.run(texts(r, gen()))[0] == preferred.name


def test_a_failure_after_the_first_event_is_an_error_naming_the_core():
    r, fakes = router(2)
    for f in fakes:
        f.fail, f.fail_after_first = p.E_IO, True

    async def run() -> list[str]:
        got: list[str] = []
        NOTE.set(RouteNote())
        async with aclosing(r.stream(gen())) as events:
            async for ev in events:
                got.append(ev.text)  # type: ignore[union-attr]
        return got

    with pytest.raises(CoreError) as err:
        asyncio.run(run())
    assert "failed after the answer had started" in err.value.message
    assert sum(f.calls for f in fakes) == 1  # not replayed on the other core


def test_errors_that_are_the_requests_own_are_not_retried():
    r, fakes = router(2)
    for f in fakes:
        f.fail = p.E_LIMIT
    with pytest.raises(CoreError) as err:
        asyncio.run(texts(r, gen()))
    assert err.value.code == p.E_LIMIT and sum(f.calls for f in fakes) == 1
    for f in fakes:
        f.fail = p.E_BUSY  # every core full: the last one's answer, after trying each
    with pytest.raises(CoreError) as err:
        asyncio.run(texts(r, gen()))
    assert err.value.code == p.E_BUSY and sum(f.calls for f in fakes) == 3


def test_metrics_carry_a_core_label_with_several_cores_only():
    engine = EngineMetrics()
    engine.ttft_ms.observe(12.0)
    snap = engine.snapshot()
    m_a, m_b = {"core": "/a.sock", "model_name": "m"}, {"core": "/b.sock", "model_name": "m"}

    def series(snapshots) -> dict[str, list[dict]]:
        m = GatewayMetrics()
        m.core.set_snapshots(snapshots)
        text = generate_latest(m.registry).decode()
        out: dict[str, list[dict]] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(s.name, []).append(s.labels)
        return out

    one = series([CoreSnapshot("/a.sock", "m", snap)])
    assert one["uma_num_requests_waiting"] == [{"model_name": "m"}] and one["uma_core_up"] == [{}]
    two = series([CoreSnapshot("/a.sock", "m", snap), CoreSnapshot("/b.sock", "", None)])
    assert two["uma_core_up"] == [{"core": "/a.sock"}, {"core": "/b.sock"}]
    assert two["uma_num_requests_waiting"] == [m_a]
    assert {**m_a, "le": "+Inf"} in two["uma_time_to_first_token_seconds_bucket"]
    assert set(one) == set(two)  # the same series names either way
    both = series([CoreSnapshot("/a.sock", "m", snap), CoreSnapshot("/b.sock", "m", snap)])
    assert both["uma_kv_cache_usage_perc"] == [m_a, m_b]  # every core family: both labels
    assert {**m_b, "qos": "interactive", "le": "+Inf"} in both[
        "uma_qos_time_to_first_token_seconds_bucket"
    ]
    assert {**m_b, "finished_reason": "stop"} in both["uma_request_success_total"]


def test_snapshots_name_each_cores_model():
    r, fakes = router(2)
    fakes[1].fail = E_CONNECT
    got = asyncio.run(r.snapshots(1.0))
    assert got[0] == CoreSnapshot(CORES[0], "model-/run/a.sock", {"uptime_s": 1.0})
    assert got[1] == CoreSnapshot(CORES[1], "", None)  # down: no snapshot, the scrape goes on
