"""Never-reused prefix-cache entries hold no more cells than the running sequences (at least
ONE_SHOT_FLOOR): in llama.cpp's unified KV cache every resident cell costs every decode, so a
stream of one-shot requests must not fill a large cache with entries nobody reuses."""

from __future__ import annotations

from uma_serve.core.prefix.index import ONE_SHOT_FLOOR, PrefixIndex


def doc(i: int, n: int = 1000) -> list[int]:
    return [100_000 + i * 10_000 + j for j in range(n)]


def test_one_shot_entries_stay_within_the_floor_in_a_big_cache() -> None:
    index = PrefixIndex(range(100, 164), budget_tokens=65536)
    for i in range(20):
        index.plan_store(doc(i), None, 0)
    assert index.one_shot_tokens <= ONE_SHOT_FLOOR
    assert len(index.entries) == ONE_SHOT_FLOOR // 1000
    # the most recent documents are the ones kept
    assert index.lookup(doc(19))[1] == 1000
    assert index.lookup(doc(0))[1] == 0


def test_the_room_follows_the_running_sequences() -> None:
    index = PrefixIndex(range(100, 164), budget_tokens=65536)
    for i in range(20):
        index.plan_store(doc(i), None, 0, running_cells=12_000)
    assert 11_000 <= index.one_shot_tokens <= 12_000


def test_reused_entries_are_not_evicted_for_one_shot_ones() -> None:
    index = PrefixIndex(range(100, 164), budget_tokens=65536)
    for i in range(3):
        e = index.plan_store(doc(i, 2000), None, 0).entry
        assert e is not None
        index.touch(e, reused=True)  # a conversation's history, re-sent every turn
    for i in range(3, 30):
        index.plan_store(doc(i), None, 0)
    for i in range(3):
        assert index.lookup(doc(i, 2000))[1] == 2000
    # a one-shot entry larger than the room is not kept, and costs the reused ones nothing
    plan = index.plan_store(doc(40, ONE_SHOT_FLOOR + 500), None, 0)
    assert plan.entry is None
    assert all(index.lookup(doc(i, 2000))[1] == 2000 for i in range(3))


def test_a_small_cache_keeps_its_old_behaviour() -> None:
    """The CPU default (4096 tokens) is within the floor: the budget alone binds."""
    index = PrefixIndex(range(100, 108), budget_tokens=4096)
    for i in range(10):
        index.plan_store(doc(i), None, 0)
    assert index.resident_tokens == 4000


def test_documents_go_before_a_conversations_first_turn() -> None:
    """Between a conversation's first and second turn (its entry not reused yet), a storm of
    pasted documents fills the one-shot room: the documents' entries go first."""
    index = PrefixIndex(range(100, 164), budget_tokens=65536)
    turn = index.plan_store(doc(0, 500), None, 0).entry
    assert turn is not None
    for i in range(1, 12):
        index.plan_store(doc(i, 1200), None, 0, bulk=True)
    assert index.lookup(doc(0, 500))[1] == 500
    assert index.one_shot_tokens <= ONE_SHOT_FLOOR
