"""Sharing a prefix that a running sequence is still computing (pure logic: the KV ops are
recorded by a stand-in runtime; the real model's side is in test_prefix_cache.py)."""

from __future__ import annotations

from uma_serve.core import protocol as p
from uma_serve.core.engine.sequence import Sequence
from uma_serve.core.engine.waiting import WaitingQueue
from uma_serve.core.metrics import EngineMetrics
from uma_serve.core.prefix.index import BLOCK, PrefixIndex
from uma_serve.core.prefix.store import PrefixStore, Reused

SYS = list(range(1000, 1000 + 4 * BLOCK + 7))  # a shared system prompt, 4 full blocks


class RecordingRuntime:
    def __init__(self) -> None:
        self.copies: list[tuple[int, int, int]] = []

    def seq_copy(self, src: int, dst: int, n: int) -> None:
        self.copies.append((src, dst, n))

    def seq_clear(self, seq_id: int) -> None: ...


def make(prompt: list[int], seq_id: int = -1, n_past: int = 0, qos="interactive", t=0) -> Sequence:
    req = p.Generate(id=f"r{seq_id}{len(prompt)}", prompt="x", qos=qos)
    seq = Sequence((1, req.id), req, prompt, arrival_ns=t, seq_id=seq_id)
    seq.n_past = n_past
    return seq


def store(hold_ms: float = 2000.0) -> tuple[PrefixStore, RecordingRuntime]:
    rt = RecordingRuntime()
    index = PrefixIndex([8, 9, 10], budget_tokens=10_000)
    return PrefixStore(rt, index, EngineMetrics(), 512, hold_ms=hold_ms), rt  # type: ignore[arg-type]


def test_a_follower_waits_while_the_leader_computes_the_shared_prefix() -> None:
    ps, _ = store()
    leader = make(SYS + [1, 2], seq_id=0, n_past=BLOCK)  # one block of the prompt done
    follower = make(SYS + [3, 4, 5])
    assert ps.waits_for_leader(follower, [leader], now_ns=0)
    leader.n_past = len(SYS) + 2  # past everything they share
    assert not ps.waits_for_leader(follower, [leader], now_ns=0)


def test_no_wait_for_a_short_share_a_lower_class_or_too_long() -> None:
    ps, _ = store(hold_ms=100.0)
    short = make(SYS[: BLOCK + 5] + [9] * 80, seq_id=0)  # one shared block only
    assert not ps.waits_for_leader(make(SYS + [3]), [short], now_ns=0)
    background = make(SYS + [1], seq_id=1, qos="background")
    assert not ps.waits_for_leader(make(SYS + [3]), [background], now_ns=0)
    assert ps.waits_for_leader(make(SYS + [3], qos="background"), [background], now_ns=0)
    stalled = make(SYS + [1], seq_id=2)  # last advanced at 0: parked for 200 ms by now
    assert not ps.waits_for_leader(make(SYS + [3]), [stalled], now_ns=200_000_000)
    stalled.last_progress_ns = 150_000_000
    assert ps.waits_for_leader(make(SYS + [3]), [stalled], now_ns=200_000_000)


def test_reuse_copies_from_the_running_leader_and_says_what_it_took() -> None:
    ps, rt = store()
    leader = make(SYS + [1, 2], seq_id=0, n_past=len(SYS) + 2)
    follower = make(SYS + [3, 4, 5], seq_id=1)
    assert ps.reuse(follower, [leader]) == Reused(len(SYS), source=0)
    assert rt.copies == [(0, 1, len(SYS))] and follower.n_past == 0  # the scheduler's to set
    assert ps.metrics.prefix_cache_hits_total == 1
    partial = make(SYS + [6], seq_id=2)
    leader.n_past = 2 * BLOCK + 3  # only that much of the KV exists yet
    assert ps.reuse(partial, [leader]).tokens == 2 * BLOCK + 3
    assert rt.copies[-1] == (0, 2, 2 * BLOCK + 3)
    whole = make(list(SYS), seq_id=3)  # the whole prompt shared: its last token is decoded
    ps.reuse(whole, [make(SYS + [1], seq_id=0, n_past=len(SYS) + 1)])
    assert rt.copies[-1] == (0, 3, len(SYS) - 1)
    assert ps.reuse(make([5] * 40, seq_id=4), [leader]) == Reused()  # nothing shared


def test_a_cached_entry_is_reused_by_its_id_and_named() -> None:
    ps, rt = store()
    ps.store(0, SYS + [1, 2], Reused())  # a finished sequence's KV, kept under a cache id
    [(src, cache_id, n)] = rt.copies
    assert (src, n) == (0, len(SYS) + 2)
    got = ps.reuse(make(SYS + [9], seq_id=1))
    assert (got.tokens, got.source) == (len(SYS), cache_id) and got.entry is not None
    assert rt.copies[-1] == (cache_id, 1, len(SYS))


def test_the_queue_admits_past_a_held_request() -> None:
    q = WaitingQueue([0, 1, 2], reserved=0)
    held, other = make(SYS + [1]), make([5] * 40)
    q.waiting.extend([held, other])
    assert q.admit(lambda s: s is held) is other
    assert q.admit(lambda s: s is held) is None and q.admittable(lambda s: s is held) is False
    assert q.admit() is held
