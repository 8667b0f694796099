"""The engine's side of the prefix cache: KV memory ops around the PrefixIndex.

The index (core/prefix/index.py) decides what is cached and what is evicted; this class
applies it to the context: tag cached cells with a new sequence's id on admission, keep a
finished sequence's KV under a cache id, drop everything when running sequences need the
room, and pin a prefix (saved to / restored from a file with llama_state_seq_*).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Protocol

from uma_serve.core.metrics import EngineMetrics, StateGauges
from uma_serve.core.policy import Constraints
from uma_serve.core.prefix.index import BLOCK, Entry, PrefixIndex, common_prefix
from uma_serve.core.runtime import Span
from uma_serve.core.runtime.api import RuntimeApi


class Prompted(Protocol):
    """A sequence as the prefix cache reads it (the engine's Sequence); it never changes one:
    what a new sequence takes from the cache comes back as ``Reused``."""

    @property
    def seq_id(self) -> int: ...
    @property
    def prompt(self) -> list[int]: ...
    @property
    def prompt_hashes(self) -> list[int]: ...
    @property
    def n_past(self) -> int: ...
    @property
    def last_progress_ns(self) -> int: ...
    @property
    def pending_prefill(self) -> int: ...
    @property
    def interactive(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Reused:
    """What a new sequence took from the cache: the KV of its first ``tokens`` positions,
    copied from ``source`` (a cache id or a running sequence's id; -1: none), and the cached
    entry it came from (None: none, or a running sequence)."""

    tokens: int = 0
    source: int = -1
    entry: Entry | None = None


class PrefixStore:
    def __init__(
        self,
        runtime: RuntimeApi,
        index: PrefixIndex,
        metrics: EngineMetrics,
        n_batch: int,
        hold_ms: float = 2000.0,
    ) -> None:
        self.runtime = runtime
        self._prefix = index
        self.metrics = metrics
        self.gauges = metrics.state()  # its entries, in the exported gauges
        self.n_batch = n_batch
        self.hold_ns = int(hold_ms * 1e6)

    @classmethod
    def build(
        cls,
        runtime: RuntimeApi,
        metrics: EngineMetrics,
        constraints: Constraints,
        budget: int,
        host_slots: int = 0,
    ) -> PrefixStore | SnapshotStore | None:
        """The engine's prefix cache: None when off (no token budget or no cache ids). A
        deterministic runtime gets the SnapshotStore, with ``host_slots`` entries at most."""
        if budget <= 0:
            return None
        if runtime.params.deterministic:
            if host_slots <= 0:
                return None
            return SnapshotStore(runtime, PrefixIndex(range(host_slots), budget), metrics)
        n_seq, n_cache = runtime.params.n_seq, runtime.params.n_seq_cache
        if n_cache <= 0:
            return None
        index = PrefixIndex(range(n_seq, n_seq + n_cache), budget)
        return cls(runtime, index, metrics, constraints.n_batch, hold_ms=constraints.starve_ms)

    def reuse(self, seq: Prompted, running: Iterable[Prompted] = ()) -> Reused:
        """Take the longest prefix of the prompt whose KV exists (all but its last token,
        which must be decoded for logits) by tagging those cells with this sequence's id:
        from a cached entry, or from a running sequence that has computed it already."""
        m = self.metrics
        m.prefix_cache_queries_total += 1
        entry, n = self._prefix.lookup(seq.prompt, seq.prompt_hashes)
        n = min(n, len(seq.prompt) - 1)
        source, shared = self._running_source(seq, running)
        if source is not None and shared > n:
            got = Reused(shared, source.seq_id)
        elif entry is not None and n > 0:
            got = Reused(n, entry.cache_id, entry)
            self._prefix.touch(entry, reused=True)
        else:
            return Reused()
        self.runtime.seq_copy(got.source, seq.seq_id, got.tokens)
        m.prefix_cache_hits_total += 1
        m.prefix_cache_cached_tokens_total += got.tokens
        return got

    def estimate(self, hashes: list[int]) -> int:
        """Cached leading tokens of a prompt with these block hashes, to a block: callable
        from the I/O thread (one dict lookup a block, atomic under the GIL; an estimate)."""
        return self._prefix.cached_length(hashes)

    def cached_length(self, seq: Prompted, running: Iterable[Prompted] = ()) -> int:
        """Leading prompt tokens ``reuse`` would copy now, from an entry or a running
        sequence's computed KV (the prompt's work left is the rest)."""
        _, n = self._prefix.lookup(seq.prompt, seq.prompt_hashes)
        _, shared = self._running_source(seq, running)
        return min(max(n, shared), len(seq.prompt) - 1)

    def _running_source(
        self, seq: Prompted, running: Iterable[Prompted]
    ) -> tuple[Prompted | None, int]:
        """The running sequence whose computed KV covers the longest prefix of the prompt
        (one that shares at least a block with it: a source is worth a copy)."""
        best, best_n = None, 0
        if not seq.prompt_hashes:
            return best, best_n
        first = seq.prompt_hashes[0]
        for other in running:
            if not other.prompt_hashes or other.prompt_hashes[0] != first:  # rules most out
                continue
            # compared token by token from the start: a hash collision cannot pass
            n = min(common_prefix(other.prompt, seq.prompt), other.n_past, len(seq.prompt) - 1)
            if n > best_n:
                best, best_n = other, n
        return best, best_n

    def holder(self, running: Collection[Prompted]) -> Callable[[Prompted], bool] | None:
        """The admission queue's hold: which waiting requests wait for a leader now."""
        if not running:
            return None
        now = time.monotonic_ns()
        return lambda seq: self.waits_for_leader(seq, running, now)

    def waits_for_leader(self, seq: Prompted, running: Iterable[Prompted], now_ns: int) -> bool:
        """Hold ``seq`` back: a running sequence is still computing at least two blocks of
        prompt that ``seq`` shares, so ``seq`` copies them later instead of computing them
        too (n choices of one request, agents started with one system prompt). Only behind
        a leader of the same or a higher class that has advanced within ``hold_ns`` (a parked
        leader lets its followers go)."""
        for other in running:
            if other.pending_prefill == 0 or now_ns - other.last_progress_ns > self.hold_ns:
                continue
            if seq.interactive and not other.interactive:
                continue
            shared = self.shared_blocks(seq, other) * BLOCK
            if shared >= 2 * BLOCK and other.n_past < min(shared, len(seq.prompt) - 1):
                return True
        return False

    @staticmethod
    def shared_blocks(a: Prompted, b: Prompted) -> int:
        """Full prompt blocks two sequences have in common (chained hashes, so a run)."""
        n = 0
        for x, y in zip(a.prompt_hashes, b.prompt_hashes, strict=False):
            if x != y:
                break
            n += 1
        return n

    def store(
        self,
        seq_id: int,
        tokens: list[int],
        reused: Reused,
        running_cells: int = 0,
        bulk: bool = False,
    ) -> None:
        """Keep a finished sequence's KV (``tokens``, by position) under a cache id, before its
        working id is cleared; ``reused``: what it took from the cache at admission;
        ``running_cells``, ``bulk``: PrefixIndex.plan_store's."""
        parent = reused.entry
        if parent is not None and self._prefix.entries.get(parent.cache_id) is not parent:
            parent = None  # evicted since (its id may hold another entry now)
        plan = self._prefix.plan_store(
            tokens,
            parent.cache_id if parent else None,
            reused.tokens if parent else 0,
            running_cells,
            bulk,
        )
        for cache_id in plan.evict:
            self.runtime.seq_clear(cache_id)
        if plan.entry is not None:
            self.runtime.seq_copy(seq_id, plan.entry.cache_id, len(plan.entry))
        _show_size(self.gauges, self._prefix)

    def can_evict(self) -> bool:
        """Whether evict_for_room would free anything (an entry that is not pinned)."""
        return any(not e.pinned for e in self._prefix.entries.values())

    def evict_for_room(self) -> bool:
        """Free cached prefixes (the KV is needed by running sequences): those never reused
        when there are any, else all of them."""
        ids = self._prefix.clear(cold_first=True)
        if not ids:
            return False
        for cache_id in ids:
            self.runtime.seq_clear(cache_id)
        _show_size(self.gauges, self._prefix)
        self.metrics.prefix_cache_evictions_total += 1
        return True

    def pin(self, tokens: list[int], kv_path: str | None) -> str:
        """Keep ``tokens``' KV resident for good (call before start). Restored from
        ``kv_path`` when it holds the same tokens, else computed and saved there.
        Returns what happened: loaded, computed, off (no prefix cache) or no slot."""
        if len(tokens) < 2:
            return "off"
        entry = self._prefix.pin(tokens)
        if entry is None:
            return "no slot"
        cid = entry.cache_id
        status = "computed"
        if kv_path and os.path.exists(kv_path):
            if self.runtime.seq_load(kv_path, cid, len(tokens) + 1) == tokens:
                status = "loaded"
            else:
                self.runtime.seq_clear(cid)
        if status == "computed":
            _prefill(self.runtime, cid, tokens, self.n_batch)
            if kv_path:
                self.runtime.seq_save(kv_path, cid, tokens)
        _show_size(self.gauges, self._prefix)
        return status


class SnapshotStore:
    """--deterministic's prefix cache: each entry's KV is kept as bytes on the host
    (``llama_state_seq_get_data``), not as cells beside the running request. The KV cache
    then holds one request at a time and nothing else: at admission it is emptied, the
    entry's cells are written back from the first cell on, in position order, and the
    request computes the rest after them. Every request's cells thus sit exactly where a
    cold computation puts them; with the deterministic runtime's shapes that makes a reused
    prefix bit-identical to a cold one (docs/MEMORY.md, "Reproducible greedy output")."""

    def __init__(self, runtime: RuntimeApi, index: PrefixIndex, metrics: EngineMetrics) -> None:
        self.runtime = runtime
        self._prefix = index
        self.metrics = metrics
        self.gauges = metrics.state()  # its entries, in the exported gauges
        self._kv: dict[int, bytes] = {}  # entry id -> its sequence state

    def reuse(self, seq: Prompted, running: Iterable[Prompted] = ()) -> Reused:
        """Empty the KV cache, then restore the longest cached prefix of the prompt (all but
        its last token) into the sequence."""
        m = self.metrics
        m.prefix_cache_queries_total += 1
        self.runtime.clear_all()
        entry, n = self._prefix.lookup(seq.prompt, seq.prompt_hashes)
        n = min(n, len(seq.prompt) - 1)
        if entry is None or n <= 0:
            return Reused()
        if not self.runtime.seq_restore(seq.seq_id, self._kv[entry.cache_id]):
            self.runtime.clear_all()
            return Reused()
        self.runtime.seq_trim(seq.seq_id, n)
        self._prefix.touch(entry, reused=True)
        m.prefix_cache_hits_total += 1
        m.prefix_cache_cached_tokens_total += n
        return Reused(n, entry.cache_id)  # a snapshot: it shares no cells with the entry

    def estimate(self, hashes: list[int]) -> int:
        return self._prefix.cached_length(hashes)

    def cached_length(self, seq: Prompted, running: Iterable[Prompted] = ()) -> int:
        _, n = self._prefix.lookup(seq.prompt, seq.prompt_hashes)
        return min(n, len(seq.prompt) - 1)

    def holder(self, running: Collection[Prompted]) -> Callable[[Prompted], bool] | None:
        return None  # one request at a time: nobody computes a prefix for a follower

    def store(
        self,
        seq_id: int,
        tokens: list[int],
        reused: Reused,
        running_cells: int = 0,
        bulk: bool = False,
    ) -> None:
        """Copy a finished sequence's KV out as a new entry (before its id is cleared); entries
        on the host cost the decodes nothing: ``running_cells`` and ``bulk`` are not needed."""
        plan = self._prefix.plan_store(tokens, None, 0)
        for cache_id in plan.evict:
            self._kv.pop(cache_id, None)
        if plan.entry is not None:
            if len(plan.entry) < len(tokens):
                self.runtime.seq_trim(seq_id, len(plan.entry))
            self._kv[plan.entry.cache_id] = self.runtime.seq_state(seq_id)
        _show_size(self.gauges, self._prefix)

    def can_evict(self) -> bool:
        """Entries hold no KV cells: dropping them frees none."""
        return False

    def evict_for_room(self) -> bool:
        """Entries hold no KV cells: dropping them frees none (False)."""
        return False

    def pin(self, tokens: list[int], kv_path: str | None) -> str:
        """As PrefixStore.pin, computed on working sequence 0 (call before start)."""
        if len(tokens) < 2:
            return "off"
        entry = self._prefix.pin(tokens)
        if entry is None:
            return "no slot"
        rt, status = self.runtime, "computed"
        rt.clear_all()
        if kv_path and os.path.exists(kv_path):
            if rt.seq_load(kv_path, 0, len(tokens) + 1) == tokens:
                status = "loaded"
            else:
                rt.clear_all()
        if status == "computed":
            _prefill(rt, 0, tokens, rt.n_batch)
            if kv_path:
                rt.seq_save(kv_path, 0, tokens)
        self._kv[entry.cache_id] = rt.seq_state(0)
        rt.clear_all()
        _show_size(self.gauges, self._prefix)
        return status


def _show_size(gauges: StateGauges, index: PrefixIndex) -> None:
    """The cache's size in the metrics, after any change to its entries."""
    gauges.prefix_cache_resident_tokens = index.resident_tokens
    gauges.prefix_cache_entries = len(index.entries)


def _prefill(runtime: RuntimeApi, seq_id: int, tokens: list[int], n_batch: int) -> None:
    """A pinned prefix's KV, computed in batches on ``seq_id``."""
    for pos in range(0, len(tokens), n_batch):
        rc, _ = runtime.decode([Span(seq_id, pos, tokens[pos : pos + n_batch], False)])
        if rc != 0:
            raise RuntimeError(f"pinning the prefix failed (llama_decode rc={rc})")
