"""The device's candidates: each row's top-k (token ids and logits) that a backend sampler kept
inside the decode graph, read from llama.cpp's buffers into arrays the sampler draws from.

llama.cpp keeps them in one buffer, an output row every ``n_vocab`` entries, outputs in batch
order. From ``BULK_ROWS`` rows on they are read as one numpy gather (16 rows 11-12 us against
32 us for five ctypes calls a row, on the 2-core CPU), when the first and last rows'
pointers say the layout is that one; fewer rows are read row by row.

Each accessor of llama.cpp's synchronizes with the device first (~10 us each on an H100's
host, where a lone stream's tick read its row through three of them). The logits buffer lies
at a fixed distance from the candidates buffer for a given number of output rows: both are
views on one allocation, laid out by that number. So the distance is learned once through the
accessors, keyed by the batch's output rows and the candidates buffer's address (a new
allocation, or an address that is not a candidates row, is a new key), and a row's logits
follow from its candidates' address: one call a row, two for a gather. A row read from the
device has its sequence's top-k attached, so its count is ``k``.
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import llama_cpp as ll
import numpy as np

from uma_serve.core.runtime.batch import DecodeBatch
from uma_serve.core.runtime.gil import held, memmove

# rows from which candidates are read as one gather: row by row costs ~2 us a row, the
# gather ~11 us (its pointer checks; 3 / 4 / 5 / 6 / 8 rows 10.3 / 10.4 / 10.5 / 10.8 / 10.9 us
# against 8.5 / 10.3 / 12.2 / 13.7 / 17.5 row by row, measured on a 2-core CPU)
BULK_ROWS = 5
KNOWN_LAYOUTS = 64  # learned distances kept at most (a batch's output rows, its allocation)
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
        # (output rows, candidates buffer's address) -> the logits buffer's distance from it
        self._offsets: dict[tuple[int, int], int] = {}

    def read(
        self, ctx: ll.llama_context_p, rows: list[int], batch: DecodeBatch
    ) -> tuple[np.ndarray, np.ndarray]:
        """The top-k of ``batch``'s ``rows`` as (rows, k) arrays of token ids and their
        logits, unsorted (a row with fewer than k candidates is padded with logit -inf)."""
        k, n_outputs = self.k, batch.n_outputs
        if self._ids.shape[0] < len(rows):
            self._ids = np.zeros((len(rows), k), dtype=np.int32)
            self._logits = np.zeros((len(rows), k), dtype=np.float32)
        ids, logits = self._ids[: len(rows)], self._logits[: len(rows)]
        # each row's place among the outputs: in order, when every output row is read
        every = n_outputs == len(rows) and rows == sorted(rows)
        bulk = self.buffers(ctx, rows, batch, every)
        if bulk is not None:
            all_ids, all_logits, out = bulk
            ids[:], logits[:] = all_ids[out, :k], all_logits[out, :k]
            return ids, logits
        ids_at, logits_at, size = ids.ctypes.data, logits.ctypes.data, k * 4
        places = range(len(rows)) if every else _places(rows, batch)
        for r, row in enumerate(rows):
            src_ids, src_logits, n = self._source(ctx, row, places[r], n_outputs, k)
            memmove(ids_at + r * size, src_ids, n * 4)
            memmove(logits_at + r * size, src_logits, n * 4)
            if n < k:
                logits[r, n:] = -np.inf
        return ids, logits

    def read_all(
        self, ctx: ll.llama_context_p, row: int, k: int, batch: DecodeBatch
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` candidates of one row whose sequence's top-k is ``k`` (a wider one than
        the others'), copied: token ids and their logits, unsorted. Its logits lie at the
        learned distance from its candidates, as ``read``'s rows' do (a vocabulary smaller
        than ``k``: all of it)."""
        (place,) = _places([row], batch)
        k = min(k, self.n_vocab)
        src_ids, src_logits, n = self._source(ctx, row, place, batch.n_outputs, k)
        ids, logits = np.empty(n, dtype=np.int32), np.empty(n, dtype=np.float32)
        memmove(ids.ctypes.data, src_ids, n * 4)
        memmove(logits.ctypes.data, src_logits, n * 4)
        return ids, logits

    def _source(
        self, ctx: ll.llama_context_p, row: int, place: int, n_outputs: int, k: int
    ) -> tuple[int, int, int]:
        """Where a row's candidates and their logits lie, and how many there are (``k`` at
        most): the logits at the distance learned for the layout, else through the accessors
        (learning it when the row holds ``k``). ``place``: the row's index among the outputs."""
        src_ids = _candidates_ith(ctx, row) or 0
        key = (n_outputs, src_ids - place * self.n_vocab * 4)
        offset = self._offsets.get(key)
        if offset is not None:
            return src_ids, src_ids + offset, k
        n, src_logits = min(_count_ith(ctx, row), k), _logits_ith(ctx, row) or 0
        if n == k and src_ids and src_logits:
            self._learn(key, src_logits - src_ids)
        return src_ids, src_logits, n

    def buffers(
        self, ctx: ll.llama_context_p, rows: list[int], batch: DecodeBatch, every: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | slice] | None:
        """Views on llama.cpp's candidate buffers as (outputs, n_vocab) arrays and the rows'
        output indices (a slice when ``every``: the rows are all the outputs, in order; their
        numpy form costs ~110 us right after a decode, 16 rows on the 2-core CPU; the rows
        themselves in a dense batch, every row of which has an output); None for fewer than
        BULK_ROWS rows, or unless both ends of ``rows`` are where that layout puts them."""
        if len(rows) < BULK_ROWS:
            return None
        out: np.ndarray | slice
        if every:  # the first and last rows are the first and last outputs
            out, ends = slice(0, len(rows)), (0, len(rows) - 1)
            first, last = ends
        else:
            out = np.asarray(rows) if batch.dense else _output_rows(rows, batch.logits)
            ends = (int(out.argmin()), int(out.argmax()))
            first, last = (int(out[end]) for end in ends)
        stride = self.n_vocab * 4
        ids0, ids1 = (_candidates_ith(ctx, rows[end]) or 0 for end in ends)
        if not ids0 or ids1 - ids0 != (last - first) * stride:
            return None
        key = (batch.n_outputs, ids0 - first * stride)
        offset = self._offsets.get(key)
        if offset is None:  # a layout not met yet: both ends through the accessors
            if any(_count_ith(ctx, rows[end]) != self.k for end in ends):
                return None
            logits0, logits1 = (_logits_ith(ctx, rows[end]) or 0 for end in ends)
            if not logits0 or logits1 - logits0 != (last - first) * stride:
                return None
            offset = self._learn(key, logits0 - ids0)
        view_key = (key[1], key[1] + offset, last + 1)
        if self._views is None or self._views[0] != view_key:  # the buffers moved or grew
            shape = (last + 1, self.n_vocab)
            all_ids = np.ctypeslib.as_array(ctypes.cast(view_key[0], _I32P), shape=shape)
            all_logits = np.ctypeslib.as_array(ctypes.cast(view_key[1], _F32P), shape=shape)
            self._views = view_key, all_ids, all_logits
        _, all_ids, all_logits = self._views
        return all_ids, all_logits, out

    def _learn(self, key: tuple[int, int], offset: int) -> int:
        if len(self._offsets) >= KNOWN_LAYOUTS:
            self._offsets.clear()
        self._offsets[key] = offset
        return offset


def _places(rows: list[int], batch: DecodeBatch) -> list[int]:
    """Each batch row's place among the outputs, as a list (a dense batch's: the rows
    themselves, with no numpy call: right after a decode one costs ~50 us on the 2-core CPU)."""
    return rows if batch.dense else _output_rows(rows, batch.logits).tolist()


def _output_rows(rows: list[int], outputs: np.ndarray) -> np.ndarray:
    """Each batch row's place among the batch's output rows."""
    return np.add.accumulate(outputs[: max(rows) + 1], dtype=np.int64)[np.asarray(rows)] - 1


def top_k_chain(k: int) -> ll.llama_sampler_p | None:
    """A sampler chain of one top-k of ``k`` for a sequence's outputs, run inside the decode
    graph (None for no device top-k)."""
    return _chain_of(ll.llama_sampler_init_top_k(k)) if k > 0 else None


def whole_row_chain() -> ll.llama_sampler_p:
    """A sampler chain that hands over a sequence's whole logits row (a temperature of 1 is
    llama.cpp's empty sampler). A sequence with no device sampler at all would make llama.cpp
    copy every output row of the decode to the host, not only its own (needs_raw_logits)."""
    return _chain_of(ll.llama_sampler_init_temp(1.0))


class DeviceDraw(NamedTuple):
    """The rest of a request's chain after its top-k, drawn inside the decode graph."""

    top_p: float
    min_p: float
    temperature: float
    seed: int


def chain_for(k: int, draw: DeviceDraw | None = None) -> ll.llama_sampler_p | None:
    """A sequence's device chain: a top-k of ``k`` (0: its whole row); with ``draw``, then
    top-p, min-p, temperature and a seeded draw, all in the graph (llama.cpp's backend
    samplers: bench floor's device form; on an H100 as fast as umad's host draw for one row,
    slower from 16 rows on, docs/BENCHMARKS.md)."""
    chain = top_k_chain(k) if k > 0 else whole_row_chain()
    if draw is None:
        return chain
    for sampler in (
        ll.llama_sampler_init_top_p(draw.top_p, 1),
        ll.llama_sampler_init_min_p(draw.min_p, 1),
        ll.llama_sampler_init_temp(draw.temperature),
        ll.llama_sampler_init_dist(draw.seed),
    ):
        ll.llama_sampler_chain_add(chain, sampler)
    return chain


def _chain_of(sampler: ll.llama_sampler_p) -> ll.llama_sampler_p:
    chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
    ll.llama_sampler_chain_add(chain, sampler)
    return chain
