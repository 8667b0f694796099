"""Prefix cache index, prompt-lookup drafting and the SpeculativeDecode transformer."""

from __future__ import annotations

from hypothesis import given, strategies as st
from msgspec.structs import replace

from uma_serve.core.policy import (
    BatchItem,
    Constraints,
    EngineStats,
    Phase,
    Plan,
    SchedulerState,
    SessionView,
    plan_shape,
)
from uma_serve.core.policy.pipeline import build_policy
from uma_serve.core.policy.spec import SpeculativeDecode, draft_length
from uma_serve.core.prefix.index import BLOCK, PrefixIndex, common_prefix
from uma_serve.core.spec.ngram import NgramIndex

SYS = list(range(1000, 1000 + 3 * BLOCK + 5))  # a shared "system prompt"


def test_lookup_finds_the_longest_common_prefix() -> None:
    idx = PrefixIndex([10, 11, 12], budget_tokens=10_000)
    a = idx.plan_store(SYS + [1, 2, 3], None, 0).entry
    b = idx.plan_store(SYS[:50] + [7, 7], None, 0).entry
    assert a is not None and b is not None and a.cache_id != b.cache_id
    entry, n = idx.lookup(SYS + [9])
    assert entry is a and n == len(SYS)
    entry, n = idx.lookup(SYS[:50] + [7, 7, 7])
    assert entry is b and n == 52
    entry, n = idx.lookup(SYS[:5])
    assert n == 5
    assert idx.lookup([1, 2, 3]) == (None, 0)


def test_a_prefix_of_an_entry_is_not_stored_again_and_an_extension_supersedes() -> None:
    idx = PrefixIndex([10, 11], budget_tokens=10_000)
    first = idx.plan_store(SYS, None, 0).entry
    assert idx.plan_store(SYS[:40], None, 0).entry is None  # already inside the first
    plan = idx.plan_store(SYS + [5, 6], first.cache_id, len(SYS))
    assert plan.evict == [first.cache_id] and plan.entry is not None
    assert list(idx.entries) == [plan.entry.cache_id]
    assert idx.resident_tokens == len(SYS) + 2


def test_shared_cells_are_counted_once_and_lru_eviction_keeps_the_budget() -> None:
    idx = PrefixIndex([10, 11, 12, 13], budget_tokens=len(SYS) + 40)
    base = idx.plan_store(SYS + [1], None, 0).entry
    child = idx.plan_store(SYS + [2, 2], base.cache_id, len(SYS)).entry
    assert child.parent == base.cache_id
    assert idx.resident_tokens == len(SYS) + 1 + 2  # the shared system prompt once
    idx.touch(base)
    # an unrelated long entry must evict LRU entries to fit
    other = list(range(5000, 5000 + len(SYS)))
    plan = idx.plan_store(other, None, 0)
    assert plan.entry is not None and child.cache_id in plan.evict
    assert idx.resident_tokens <= idx.budget


def test_evicting_a_parent_makes_its_childs_cells_its_own() -> None:
    idx = PrefixIndex([10, 11], budget_tokens=10_000)
    base = idx.plan_store(SYS + [1], None, 0).entry
    child = idx.plan_store(SYS + [2], base.cache_id, len(SYS)).entry
    assert idx.evict_lru() == base.cache_id
    assert child.parent is None and child.shared == 0
    assert idx.resident_tokens == len(child)


def test_out_of_ids_evicts_the_least_recently_used() -> None:
    idx = PrefixIndex([10], budget_tokens=10_000)
    a = idx.plan_store(SYS, None, 0).entry
    plan = idx.plan_store(list(range(50, 100)), None, 0)
    assert plan.evict == [a.cache_id] and plan.entry.cache_id == a.cache_id


def test_too_short_or_too_long_is_not_stored() -> None:
    idx = PrefixIndex([10], budget_tokens=100)
    assert idx.plan_store([1, 2, 3], None, 0).entry is None
    assert idx.plan_store(list(range(200)), None, 0).entry is None


def _naive_common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@given(
    st.lists(st.integers(0, 2), max_size=3 * BLOCK),
    st.integers(0, 3 * BLOCK + 5),
    st.lists(st.integers(0, 2), max_size=BLOCK + 3),
)
def test_common_prefix_compares_by_blocks_as_token_by_token(
    head: list[int], cut: int, tail: list[int]
) -> None:
    a = head + tail
    b = head[:cut] + [7] + head[cut:]  # differs at cut (if cut is inside head)
    for x, y in ((a, b), (a, head), (head, a), (a, a), (a, tuple(b))):
        want = _naive_common_prefix(list(x), list(y))
        assert common_prefix(x, y) == want
        assert common_prefix(x, y, min(want, 5)) == want  # from a known-equal start


def test_ngram_drafts_what_followed_the_last_occurrence() -> None:
    ng = NgramIndex([1, 2, 3, 4, 5, 6, 9, 1, 2])
    assert ng.draft(3) == (3, 4, 5)
    ng.append(3)
    assert ng.draft(2) == (4, 5)
    ng.append(8)  # never seen: no draft
    assert ng.draft(4) == ()


def test_draft_length_maximises_tokens_per_ms_and_probes_when_nothing_pays() -> None:
    # a 15 ms tick, 4 ms per drafted token, one stream
    assert draft_length(0.95, 6, 10, tick_ms=15, draft_ms=4) == 6
    assert draft_length(0.95, 6, 3, tick_ms=15, draft_ms=4) == 3
    assert 1 <= draft_length(0.6, 6, 10, tick_ms=15, draft_ms=4) < 6
    assert draft_length(0.2, 6, 10, tick_ms=15, draft_ms=4) == 0
    assert draft_length(0.2, 6, 10, tick_ms=15, draft_ms=4, probe=True) == 2
    assert draft_length(0.9, 6, 10, tick_ms=15, draft_ms=40) == 0  # drafts too dear


def test_a_draft_must_be_better_accepted_the_more_streams_share_the_tick() -> None:
    # 0.35 acceptance pays for a lone stream's tick, not for four streams' (a 4 ms draft slows
    # all four); 0.9 pays for both
    assert draft_length(0.35, 6, 10, tick_ms=15, draft_ms=4, tokens=1) > 0
    assert draft_length(0.35, 6, 10, tick_ms=40, draft_ms=4, tokens=4) == 0
    assert draft_length(0.9, 6, 10, tick_ms=40, draft_ms=4, tokens=4) > 0


def _view(seq_id: int, draft: tuple[int, ...] = (), qos: str = "interactive") -> SessionView:
    return SessionView(
        seq_id, Phase.DECODE, qos, 10, 100, 0, 5, 0, draft=draft, spec_accept_ewma=0.95
    )


def _state(*views: SessionView) -> SchedulerState:
    return SchedulerState(sessions=views, stats=EngineStats(tick=1), now_ns=0)


C = Constraints(n_batch=64, tick_budget_ms=1e9, spec_max_draft=4, spec_max_streams=2)


def test_spec_extends_a_lone_decoder_with_its_draft() -> None:
    plan = Plan(items=(BatchItem(0, Phase.DECODE, 1, True),))
    out = SpeculativeDecode().apply(plan, _state(_view(0, (5, 6, 7, 8, 9))), C)
    assert out.items[0].n_tokens == 5
    shape = plan_shape(out.items, {0: _view(0)})
    assert shape.decode == 5 and shape.prefill == 0  # drafted rows cost like decoding rows


def test_spec_backs_off_under_load_and_when_off() -> None:
    views = [_view(i, (5, 6)) for i in range(3)]
    plan = Plan(items=tuple(BatchItem(i, Phase.DECODE, 1, True) for i in range(3)))
    assert SpeculativeDecode().apply(plan, _state(*views), C) == plan
    one = Plan(items=(BatchItem(0, Phase.DECODE, 1, True),))
    off = Constraints(n_batch=64, tick_budget_ms=1e9, spec_max_draft=0)
    assert SpeculativeDecode().apply(one, _state(views[0]), off) == one


def test_four_streams_draft_only_what_pays_for_all_four() -> None:
    c4 = replace(C, spec_max_streams=4)
    plan = Plan(items=tuple(BatchItem(i, Phase.DECODE, 1, True) for i in range(4)))

    def drafted(p: float, tick: int = 1) -> list[int]:
        views = [replace(_view(i, (5, 6, 7, 8)), spec_accept_ewma=p) for i in range(4)]
        state = SchedulerState(sessions=tuple(views), stats=EngineStats(tick=tick), now_ns=0)
        return [i.n_tokens - 1 for i in SpeculativeDecode().apply(plan, state, c4).items]

    assert all(k > 0 for k in drafted(0.95))
    assert drafted(0.3) == [0, 0, 0, 0]
    # a draft at 0.3 pays for a lone stream; probes come one stream at a time, rarely
    assert sum(k > 0 for k in drafted(0.3, tick=128)) == 1
    assert sum(sum(k > 0 for k in drafted(0.3, tick=t)) for t in range(1, 129)) == 4
    one = Plan(items=(BatchItem(0, Phase.DECODE, 1, True),))
    lone = replace(_view(0, (5, 6, 7, 8)), spec_accept_ewma=0.3)
    state = SchedulerState(sessions=(lone,), stats=EngineStats(tick=1), now_ns=0)
    assert SpeculativeDecode().apply(one, state, c4).items[0].n_tokens > 1


def test_spec_is_a_pipeline_transformer() -> None:
    policy = build_policy(["qos", "spec", "latency"])
    state = _state(_view(0, (5, 6, 7)))
    plan = policy.schedule_tick(state, C)
    assert plan.items[0].n_tokens == 4


def test_a_pinned_prefix_is_never_evicted_nor_superseded() -> None:
    idx = PrefixIndex([10, 11], budget_tokens=len(SYS) + 60)
    pinned = idx.pin(SYS)
    assert pinned is not None and pinned.pinned
    child = idx.plan_store(SYS + [1, 2], pinned.cache_id, len(SYS))
    assert child.entry is not None and child.evict == []  # the pinned entry stays
    other = idx.plan_store(list(range(7000, 7040)), None, 0)
    assert pinned.cache_id not in other.evict and pinned.cache_id in idx.entries
    assert idx.clear() == [other.entry.cache_id] and list(idx.entries) == [pinned.cache_id]
    assert idx.lookup(SYS + [5]) == (pinned, len(SYS))
