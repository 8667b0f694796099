"""Prefix cache index: which cached KV prefix best serves a new prompt, and what to evict.

Pure bookkeeping over token ids; the engine owns the KV and applies the decisions
(``llama_memory_seq_cp`` into the new sequence, ``seq_rm`` of evicted entries).

Each entry is a token list whose KV sits in the context under the entry's own *cache sequence
id* (the context has ``n_seq`` working ids plus ``slots`` cache ids). The index is a hashed
block chain: block i of a token list (``BLOCK`` tokens) is keyed by a hash chained over blocks
0..i, so a prompt's longest cached prefix is found by walking its own chain (one dict lookup
per block) and then comparing at most one block of tokens; the match is verified token by token
before it is used, so a hash collision can never serve wrong KV.

Resident size: in a unified KV cache a ``seq_cp`` only tags cells with another id, so an entry
built on top of an earlier entry's prefix shares those cells. Each entry remembers its parent
and how many leading cells it shares with it; resident tokens count shared cells once.

Eviction, when over the token budget or out of cache ids, weighs frequency before recency:
entries never reused (a pasted document, answered once) go first, a bulk request's before a
chat turn's, least recently used first; together they hold no more cells than the running
sequences (at least ONE_SHOT_FLOOR), since every resident cell costs every decode;
entries that were reused, or that extend a reused prefix (a system prompt, a conversation's
history, which every client re-sends each turn), only when no such entry is left. A
conversation's turn is stored as an extension of the entry it reused and keeps its count, so
a stream of one-shot documents cannot push a live conversation out (a segmented LRU;
docs/MEMORY.md). A never-reused entry that is evicted leaves its block hashes behind for a
while (a *ghost*, as in 2Q and ARC): a new entry whose first two blocks or more match a ghost
holds a prefix seen before, and counts as reused. A conversation whose first turn was pushed
out before its second came (a busy server) then misses once, not at every turn.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

BLOCK = 32  # tokens per hashed block
MIN_STORE = 16  # shorter finished sequences are not worth an entry
GHOST_BLOCKS = 8192  # block hashes of evicted never-reused entries remembered (~0.5 MB)
# cells never-reused entries may hold at least; beyond it, no more than the running sequences
# hold: every resident cell costs every decode (llama.cpp's attention mask spans them all)
ONE_SHOT_FLOOR = 4096


def block_hashes(tokens: Sequence[int], n_blocks: int | None = None) -> list[int]:
    """Chained hashes of the full blocks of ``tokens`` (the first ``n_blocks`` at most)."""
    out: list[int] = []
    h = 0
    n = len(tokens) // BLOCK if n_blocks is None else min(n_blocks, len(tokens) // BLOCK)
    for i in range(n):
        h = hash((h, tuple(tokens[i * BLOCK : (i + 1) * BLOCK])))
        out.append(h)
    return out


def common_prefix(a: Sequence[int], b: Sequence[int], start: int = 0) -> int:
    """Length of the common beginning of ``a`` and ``b`` (from ``start``, assumed equal before).
    Compared a block of slices at a time: a token-by-token Python loop over a 1,500-token
    system prompt costs ~0.1 ms, and the engine runs several per request on the tick's path."""
    n = min(len(a), len(b))
    i = start
    while i + BLOCK <= n and a[i : i + BLOCK] == b[i : i + BLOCK]:
        i += BLOCK
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Entry:
    cache_id: int  # the sequence id that holds this entry's KV
    tokens: list[int]
    hashes: list[int]
    last_used: int
    parent: int | None = None  # cache id of the entry whose leading cells it shares
    shared: int = 0  # how many leading cells it shares with the parent
    pinned: bool = False  # --pin-prefix: never evicted, never superseded
    hits: int = 0  # times a request reused it (kept by the entry that extends it)
    bulk: bool = False  # stored by a request whose prompt was bulk work (a pasted document)

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class StorePlan:
    """What the engine does to store a finished sequence: clear ``evict`` ids (in order), then
    copy the sequence's first ``len(entry)`` positions into ``entry.cache_id`` (if entry)."""

    entry: Entry | None
    evict: list[int] = field(default_factory=list)


class PrefixIndex:
    def __init__(self, cache_ids: Sequence[int], budget_tokens: int) -> None:
        self.free_ids = list(cache_ids)
        self.budget = budget_tokens
        self.entries: dict[int, Entry] = {}
        self._by_hash: dict[int, set[int]] = {}
        # entries by their first token: those a prompt shares anything with when it shares no
        # whole block (a lookup and a store then compare a few entries, not all of them)
        self._by_first: dict[int, set[int]] = {}
        self._ghosts: dict[int, None] = {}  # evicted never-reused entries' hashes, oldest first
        self._clock = 0

    # ---- queries ----

    @property
    def resident_tokens(self) -> int:
        """KV cells held only by the cache (cells shared with a resident parent counted once)."""
        return self._sizes()[0]

    def lookup(
        self, tokens: Sequence[int], hashes: list[int] | None = None
    ) -> tuple[Entry | None, int]:
        """The entry with the longest common prefix with ``tokens``, and that length
        (``hashes``: the tokens' block_hashes, when the caller has them already)."""
        if not self.entries or not tokens:
            return None, 0
        candidates: Collection[int] = self._by_first.get(tokens[0], ())
        depth = 0
        for h in block_hashes(tokens) if hashes is None else hashes:
            hit = self._by_hash.get(h)
            if not hit:
                break
            candidates, depth = hit, depth + 1
        best, best_n = None, 0
        for cid in candidates:
            e = self.entries[cid]
            n = common_prefix(e.tokens, tokens, depth * BLOCK)
            if n > best_n or (n == best_n and best is not None and e.last_used > best.last_used):
                best, best_n = e, n
        if best is None or best_n == 0:
            return None, 0
        if list(best.tokens[:best_n]) != list(tokens[:best_n]):  # a hash collision: no reuse
            return None, 0
        return best, best_n

    def touch(self, entry: Entry, reused: bool = False) -> None:
        self._clock += 1
        entry.last_used = self._clock
        entry.hits += reused

    def cached_length(self, hashes: Sequence[int]) -> int:
        """Leading tokens of a prompt with these block hashes that some entry holds, to a
        block (an estimate: hashes, not tokens, compared)."""
        n = 0
        for h in hashes:
            if h not in self._by_hash:
                break
            n += 1
        return n * BLOCK

    # ---- updates ----

    @property
    def one_shot_tokens(self) -> int:
        """Cells held by entries never reused."""
        return self._sizes()[1]

    def _sizes(self) -> tuple[int, int]:
        """Cells the cache holds (shared with a resident parent counted once), and those of
        them that entries never reused hold: one pass for both."""
        resident = one_shot = 0
        for e in self.entries.values():
            own = len(e.tokens) - (e.shared if e.parent in self.entries else 0)
            resident += own
            if e.hits == 0 and not e.pinned:
                one_shot += own
        return resident, one_shot

    def plan_store(
        self,
        tokens: Sequence[int],
        parent: int | None,
        shared: int,
        running_cells: int = 0,
        bulk: bool = False,
    ) -> StorePlan:
        """Decide how to keep ``tokens`` (a finished sequence's KV) and apply it to the index.

        ``parent``/``shared``: the entry the sequence's leading ``shared`` cells were copied
        from at admission (None/0 if it computed its KV itself). ``running_cells``: what the
        running sequences hold; never-reused entries hold no more (at least ONE_SHOT_FLOOR).
        ``bulk``: the request's prompt was bulk work; such entries go first."""
        tokens = list(tokens)
        if len(tokens) < MIN_STORE or len(tokens) > self.budget:
            return StorePlan(None)
        existing, n = self.lookup(tokens)
        if existing is not None and n == len(tokens):  # already cached (maybe inside a longer one)
            self.touch(existing)
            return StorePlan(None)
        evict: list[int] = []
        hashes = block_hashes(tokens)
        hits = self._reuse_count(parent, shared, hashes)
        # entries that are prefixes of the new one are superseded by it
        for e in [self.entries[i] for i in self._by_first.get(tokens[0], ())]:
            if e.pinned:
                continue
            if len(e) <= len(tokens) and e.tokens == tokens[: len(e)]:
                hits = max(hits, _inherited(e, len(e)))
                if e.cache_id == parent:
                    parent, shared = e.parent, min(shared, e.shared) if e.parent is not None else 0
                evict.append(self._remove(e.cache_id))
        if parent not in self.entries:
            parent, shared = None, 0
        one_shot_room = max(ONE_SHOT_FLOOR, running_cells) if hits == 0 else None
        parent, shared = self._make_room(len(tokens), parent, shared, one_shot_room, evict)
        own = len(tokens) - shared
        if not self.free_ids or (one_shot_room is not None and own > one_shot_room):
            return StorePlan(None, evict)
        entry = Entry(self.free_ids.pop(), tokens, hashes, 0, parent, shared if parent else 0)
        entry.hits, entry.bulk = hits, bulk
        if entry.parent is None:
            entry.shared = 0
        self._add(entry)
        return StorePlan(entry, evict)

    def _make_room(
        self, n: int, parent: int | None, shared: int, one_shot_room: int | None, evict: list[int]
    ) -> tuple[int | None, int]:
        """Evict (ids appended to ``evict``) until an id is free, the budget holds the new
        entry's unshared cells and, for a one-shot entry (``one_shot_room`` not None), the
        one-shot entries' room holds them too; the new entry's parent and shared length."""

        def over() -> bool:
            own = n - shared
            if not self.free_ids:
                return True
            resident, one_shot = self._sizes()  # one_shot > 0: the next victim is one of them
            if resident + own > self.budget:
                return True
            return one_shot_room is not None and one_shot > 0 and one_shot + own > one_shot_room

        while self._evictable() and over():
            victim = self._victim()
            if victim.cache_id == parent:
                parent, shared = victim.parent, min(shared, victim.shared)
                if parent is None:
                    shared = 0
            evict.append(self._evict(victim))
        return parent, shared

    def _reuse_count(self, parent: int | None, shared: int, hashes: list[int]) -> int:
        """What a new entry starts with: its parent's count (the entry its request reused), or
        one for a prefix an evicted entry held (a ghost); a superseded entry's is added later."""
        hits = _inherited(self.entries.get(parent) if parent is not None else None, shared)
        return max(hits, 1) if self._ghost_blocks(hashes) >= 2 else hits

    def pin(self, tokens: Sequence[int]) -> Entry | None:
        """Reserve a cache id for a pinned prefix (the engine fills its KV); None if no id."""
        if not self.free_ids:
            return None
        entry = Entry(self.free_ids.pop(), list(tokens), block_hashes(tokens), 0, pinned=True)
        self._add(entry)
        return entry

    def _add(self, entry: Entry) -> None:
        self.touch(entry)
        self.entries[entry.cache_id] = entry
        for h in entry.hashes:
            self._by_hash.setdefault(h, set()).add(entry.cache_id)
        self._by_first.setdefault(entry.tokens[0], set()).add(entry.cache_id)

    def _evictable(self) -> list[Entry]:
        return [e for e in self.entries.values() if not e.pinned]

    def _victim(self) -> Entry:
        """The next entry to evict: never reused before reused, a pasted document's before a
        chat turn's (a conversation's first turn, not reused yet), least recently used first."""
        return min(self._evictable(), key=lambda e: (e.hits > 0, not e.bulk, e.last_used))

    def evict_lru(self) -> int | None:
        """Drop the next victim (the engine clears its id); None if none."""
        if not self._evictable():
            return None
        return self._evict(self._victim())

    def clear(self, cold_first: bool = False) -> list[int]:
        """Drop every entry but the pinned ones, or with ``cold_first`` only those never
        reused when there are any; their ids."""
        victims = self._evictable()
        if cold_first and any(e.hits == 0 for e in victims):
            victims = [e for e in victims if e.hits == 0]
        return [self._evict(e) for e in victims]

    def _evict(self, e: Entry) -> int:
        """Remove an entry for room; one never reused leaves its hashes as a ghost."""
        if e.hits == 0:
            for h in e.hashes:
                self._ghosts.pop(h, None)
                self._ghosts[h] = None
            while len(self._ghosts) > GHOST_BLOCKS:  # the oldest go (a dict keeps its order)
                del self._ghosts[next(iter(self._ghosts))]
        return self._remove(e.cache_id)

    def _ghost_blocks(self, hashes: list[int]) -> int:
        """Leading blocks of a token list that an evicted entry held."""
        n = 0
        for h in hashes:
            if h not in self._ghosts:
                break
            n += 1
        return n

    def _remove(self, cache_id: int) -> int:
        e = self.entries.pop(cache_id)
        for index, keys in ((self._by_hash, e.hashes), (self._by_first, e.tokens[:1])):
            for key in keys:
                ids = index.get(key)
                if ids is not None:
                    ids.discard(cache_id)
                    if not ids:
                        del index[key]
        for child in self.entries.values():  # children now share only what e shared upstream
            if child.parent == cache_id:
                child.parent = e.parent
                child.shared = min(child.shared, e.shared) if e.parent is not None else 0
        self.free_ids.append(cache_id)
        return cache_id


def _inherited(entry: Entry | None, shared: int) -> int:
    """The reuse count a new entry takes over from ``entry``, whose first ``shared`` tokens it
    holds: a request that reused two blocks or more of it stores a prefix seen before."""
    return entry.hits if entry is not None and shared >= 2 * BLOCK else 0
