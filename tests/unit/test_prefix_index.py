"""The prefix index's lookups against a brute-force reference: whatever was stored, evicted,
superseded or pinned, a prompt finds the longest prefix any entry holds, and the sizes the
eviction rules read are the entries' own. Token lists come from a small alphabet, so prompts
share prefixes shorter than a block, a block, or several."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from uma_serve.core.prefix.index import BLOCK, GHOST_BLOCKS, PrefixIndex, common_prefix

# a few stems, each extended by a few tokens: prompts that share 0, some or all of a stem
STEMS = [[7] * 3, [7] * 40, [7, 8] * 45, [9] * 70, [5, 6, 7] * 30]
tails = st.lists(st.integers(0, 3), min_size=0, max_size=40)
prompts = st.builds(lambda i, t: STEMS[i] + t, st.integers(0, len(STEMS) - 1), tails)
ops = st.lists(st.tuples(st.sampled_from(["store", "pin", "evict", "reuse"]), prompts), max_size=40)


def reference(index: PrefixIndex, tokens: list[int]) -> int:
    """The longest common prefix of ``tokens`` with any entry, by comparing every entry."""
    return max((common_prefix(e.tokens, tokens) for e in index.entries.values()), default=0)


def sizes(index: PrefixIndex) -> tuple[int, int]:
    held = [
        (len(e.tokens) - (e.shared if e.parent in index.entries else 0), e)
        for e in index.entries.values()
    ]
    one_shot = sum(n for n, e in held if e.hits == 0 and not e.pinned)
    return sum(n for n, _ in held), one_shot


@settings(max_examples=300, deadline=None)
@given(ops, st.lists(prompts, min_size=1, max_size=8))
def test_a_lookup_finds_the_longest_prefix_any_entry_holds(
    steps: list[tuple[str, list[int]]], probes: list[list[int]]
) -> None:
    index = PrefixIndex(range(100, 106), budget_tokens=400)
    for op, tokens in steps:
        if op == "store":
            index.plan_store(tokens, None, 0, running_cells=100)
        elif op == "pin":
            index.pin(tokens)
        elif op == "evict":
            index.evict_lru()
        else:  # a request reused what it found, then stored its own tokens on top
            entry, n = index.lookup(tokens)
            if entry is not None:
                index.touch(entry, reused=True)
            index.plan_store(tokens + [1, 2], entry.cache_id if entry else None, n)
        assert (index.resident_tokens, index.one_shot_tokens) == sizes(index)
    for tokens in probes + [tokens for _, tokens in steps]:
        entry, n = index.lookup(tokens)
        assert n == reference(index, tokens)
        if n:
            assert entry is not None and entry.tokens[:n] == tokens[:n]


def test_a_prompt_sharing_less_than_a_block_finds_its_entry_and_others_do_not() -> None:
    index = PrefixIndex(range(100, 104), budget_tokens=4096)
    stored = list(range(1, 3 * BLOCK))
    index.plan_store(stored, None, 0)
    entry, n = index.lookup([1, 2, 3, 999])
    assert entry is not None and n == 3
    assert index.lookup([999, 2, 3, 4]) == (None, 0)  # the same tokens after another first one
    index.evict_lru()
    assert index.lookup([1, 2, 3, 999]) == (None, 0)
    assert not index._by_first and not index._by_hash  # an evicted entry leaves nothing behind


def test_ghosts_keep_the_newest_blocks_up_to_their_bound() -> None:
    index = PrefixIndex(range(100, 102), budget_tokens=1 << 20)
    per_doc = 64  # blocks an entry leaves as a ghost
    n_docs = GHOST_BLOCKS // per_doc + 4
    docs = [[d * 100_000 + j for j in range(per_doc * BLOCK)] for d in range(n_docs)]
    for doc in docs:
        index.plan_store(doc, None, 0)
        index.evict_lru()
    assert len(index._ghosts) == GHOST_BLOCKS
    # the last evicted document is remembered: stored again, it counts as reused
    again = index.plan_store(docs[-1], None, 0).entry
    assert again is not None and again.hits == 1
    # the first ones are forgotten: stored again, they start from nothing
    index.evict_lru()
    first = index.plan_store(docs[0], None, 0).entry
    assert first is not None and first.hits == 0
