"""The engine's side of the prefix cache: KV memory ops around the PrefixIndex.

The index (core/policy/prefix.py) decides what is cached and what is evicted; this class
applies it to the context: tag cached cells with a new sequence's id on admission, keep a
finished sequence's KV under a cache id, drop everything when running sequences need the
room, and pin a prefix (saved to / restored from a file with llama_state_seq_*).
"""

from __future__ import annotations

import os

from uma_serve.core.metrics import EngineMetrics
from uma_serve.core.policy.prefix import Entry, PrefixIndex
from uma_serve.core.runtime import Runtime, Span
from uma_serve.core.sequence import Sequence


class PrefixStore:
    def __init__(
        self, runtime: Runtime, index: PrefixIndex, metrics: EngineMetrics, n_batch: int
    ) -> None:
        self.runtime = runtime
        self._prefix = index
        self.metrics = metrics
        self.n_batch = n_batch

    def reuse(self, seq: Sequence) -> None:
        """Take the longest cached prefix of the prompt (all but its last token, which must be
        decoded for logits) by tagging the cached cells with this sequence's id."""
        m = self.metrics
        m.prefix_cache_queries_total += 1
        entry, n = self._prefix.lookup(seq.prompt)
        n = min(n, len(seq.prompt) - 1)
        if entry is None or n <= 0:
            return
        self.runtime.seq_copy(entry.cache_id, seq.seq_id, n)
        self._prefix.touch(entry)
        seq.n_past = seq.cached_tokens = n
        seq.cached_from = entry
        m.prefix_cache_hits_total += 1
        m.prefix_cache_cached_tokens_total += n

    def store(self, seq: Sequence) -> None:
        """Keep a finished sequence's KV under a cache id (before its working id is cleared)."""
        parent: Entry | None = seq.cached_from
        if parent is not None and self._prefix.entries.get(parent.cache_id) is not parent:
            parent = None  # evicted since (its id may hold another entry now)
        plan = self._prefix.plan_store(
            seq.kv_tokens(),
            parent.cache_id if parent else None,
            seq.cached_tokens if parent else 0,
        )
        for cache_id in plan.evict:
            self.runtime.seq_clear(cache_id)
        if plan.entry is not None:
            self.runtime.seq_copy(seq.seq_id, plan.entry.cache_id, len(plan.entry))
        self.metrics.prefix_cache_resident_tokens = self._prefix.resident_tokens
        self.metrics.prefix_cache_entries = len(self._prefix.entries)

    def evict_all(self) -> bool:
        """Free every cached prefix (the KV is needed by running sequences)."""
        ids = self._prefix.clear()
        if not ids:
            return False
        for cache_id in ids:
            self.runtime.seq_clear(cache_id)
        self.metrics.prefix_cache_resident_tokens = self._prefix.resident_tokens
        self.metrics.prefix_cache_entries = len(self._prefix.entries)
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
            for pos in range(0, len(tokens), self.n_batch):
                chunk = tokens[pos : pos + self.n_batch]
                rc, _ = self.runtime.decode([Span(cid, pos, chunk, False)])
                if rc != 0:
                    raise RuntimeError(f"pinning the prefix failed (llama_decode rc={rc})")
            if kv_path:
                self.runtime.seq_save(kv_path, cid, tokens)
        self.metrics.prefix_cache_resident_tokens = self._prefix.resident_tokens
        self.metrics.prefix_cache_entries = len(self._prefix.entries)
        return status
