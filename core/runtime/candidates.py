"""The device's candidates: each row's top-k (token ids and logits) that a backend sampler kept
inside the decode graph, read from llama.cpp's buffers into arrays the sampler draws from.

llama.cpp keeps them in one buffer, an output row every ``n_vocab`` entries, outputs in batch
order. From ``BULK_ROWS`` rows on they are read as one numpy gather (16 rows 11-12 us against
32 us for five ctypes calls a row, on the 2-core CPU), when the first and last rows'
pointers and counts say the layout is that one; fewer rows are read row by row.
"""

from __future__ import annotations

import ctypes

import llama_cpp as ll
import numpy as np

from uma_serve.core.runtime.gil import held, memmove

# rows from which candidates are read as one gather: row by row costs ~2 us a row, the
# gather ~11 us (its pointer checks; 3 / 4 / 5 / 6 / 8 rows 10.3 / 10.4 / 10.5 / 10.8 / 10.9 us
# against 8.5 / 10.3 / 12.2 / 13.7 / 17.5 row by row, measured on a 2-core CPU)
BULK_ROWS = 5
_I32P, _F32P = ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_float)
# read after the tick's synchronize: they return at once, so they keep the GIL (gil.py)
# and return addresses as ints: a pointer object and its cast cost ~1.5 us each
_count_ith = held(ll.llama_get_sampled_candidates_count_ith)
_candidates_ith = held(ll.llama_get_sampled_candidates_ith, ctypes.c_void_p)
_logits_ith = held(ll.llama_get_sampled_logits_ith, ctypes.c_void_p)


class DeviceCandidates:
    """The arrays the candidates are copied into (reused: valid until the next read)."""

    def __init__(self, k: int, n_vocab: int) -> None:
        self.k, self.n_vocab = k, n_vocab
        self._ids = np.zeros((0, k), dtype=np.int32)
        self._logits = np.zeros((0, k), dtype=np.float32)
        # views on llama.cpp's candidate buffers, by their base addresses and rows: the
        # buffers stay where they are from tick to tick, and two views cost ~15 us to make
        self._views: tuple[tuple[int, int, int], np.ndarray, np.ndarray] | None = None

    def read(
        self, ctx: ll.llama_context_p, rows: list[int], outputs: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The top-k of batch ``rows`` as (rows, k) arrays of token ids and their logits,
        unsorted (a row with fewer than k candidates is padded with logit -inf); ``outputs``:
        the batch's logits flags (which rows have an output)."""
        k = self.k
        if self._ids.shape[0] < len(rows):
            self._ids = np.zeros((len(rows), k), dtype=np.int32)
            self._logits = np.zeros((len(rows), k), dtype=np.float32)
        ids, logits = self._ids[: len(rows)], self._logits[: len(rows)]
        bulk = self.buffers(ctx, rows, outputs)
        if bulk is not None:
            all_ids, all_logits, out = bulk
            ids[:], logits[:] = all_ids[out, :k], all_logits[out, :k]
            return ids, logits
        ids_at, logits_at, size = ids.ctypes.data, logits.ctypes.data, k * 4
        for r, row in enumerate(rows):
            n = min(_count_ith(ctx, row), k)
            src_ids = _candidates_ith(ctx, row)
            src_logits = _logits_ith(ctx, row)
            memmove(ids_at + r * size, src_ids, n * 4)
            memmove(logits_at + r * size, src_logits, n * 4)
            if n < k:
                logits[r, n:] = -np.inf
        return ids, logits

    def buffers(
        self, ctx: ll.llama_context_p, rows: list[int], outputs: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Views on llama.cpp's candidate buffers as (outputs, n_vocab) arrays and each row's
        output index; None for fewer than BULK_ROWS rows, or unless both ends of ``rows``
        are where that layout puts them."""
        if len(rows) < BULK_ROWS:
            return None
        at = np.asarray(rows)
        out = np.add.accumulate(outputs[: max(rows) + 1], dtype=np.int64)[at] - 1
        ends = (int(out.argmin()), int(out.argmax()))
        pointers = []
        for end in ends:
            row = rows[end]
            if _count_ith(ctx, row) != self.k:
                return None
            pointers.append((_candidates_ith(ctx, row) or 0, _logits_ith(ctx, row) or 0))
        stride = self.n_vocab * 4
        first, last = (int(out[end]) for end in ends)
        (ids0, logits0), (ids1, logits1) = pointers
        if not ids0 or not logits0 or ids1 - ids0 != (last - first) * stride:
            return None
        if logits1 - logits0 != (last - first) * stride:
            return None
        base = first * stride
        key = (ids0 - base, logits0 - base, last + 1)
        if self._views is None or self._views[0] != key:  # llama.cpp's buffers moved or grew
            shape = (last + 1, self.n_vocab)
            all_ids = np.ctypeslib.as_array(ctypes.cast(key[0], _I32P), shape=shape)
            all_logits = np.ctypeslib.as_array(ctypes.cast(key[1], _F32P), shape=shape)
            self._views = key, all_ids, all_logits
        _, all_ids, all_logits = self._views
        return all_ids, all_logits, out


def top_k_chain(k: int) -> ll.llama_sampler_p | None:
    """A sampler chain of one top-k of ``k`` for a sequence's outputs, run inside the decode
    graph (None for no device top-k)."""
    return _chain_of(ll.llama_sampler_init_top_k(k)) if k > 0 else None


def whole_row_chain() -> ll.llama_sampler_p:
    """A sampler chain that hands over a sequence's whole logits row (a temperature of 1 is
    llama.cpp's empty sampler). A sequence with no device sampler at all would make llama.cpp
    copy every output row of the decode to the host, not only its own (needs_raw_logits)."""
    return _chain_of(ll.llama_sampler_init_temp(1.0))


def _chain_of(sampler: ll.llama_sampler_p) -> ll.llama_sampler_p:
    chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
    ll.llama_sampler_chain_add(chain, sampler)
    return chain
