"""The chain's draw: each row's token from its candidates, as (rows, width) arrays.

Greedy rows take their largest logit (the lowest id on a tie); the others go through top-k ->
top-p -> min-p -> temperature and one draw from their own RNG along the row sorted by logit,
with llama.cpp's maths (core/sampling.py turns a decode's rows into candidates). Candidates
(the device's top-k, a host row's cut) are drawn in C, one call a tick (draw.c: on an H100's
host each numpy call costs ~5-10 us right after the device's wait, and the numpy draw made
about ten a row). Whole rows in id order (a CPU's request with no top-k or top-p: 262,144
logits a row) are drawn unsorted with numpy, whose vectorised maths is the faster there.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from uma_serve.core.native import library
from uma_serve.core.runtime.gil import count

NO_ID = np.iinfo(np.int32).max  # padding's id; never drawn (its logit is -inf)

_native = library(Path(__file__).parent, "_draw")[0].uma_draw  # keeps the GIL: it is short
_native.restype = ctypes.c_int
_native.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int,
                    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                    ctypes.c_void_p]  # fmt: skip


class Chain(Protocol):
    """What a row's draw reads of its sequence's sampling (core/sampling.py's SamplerState)."""

    chain: tuple[float, float, float, float]  # top-k width, log min-p, top-p, temperature

    def uniform(self) -> float: ...  # its RNG's next draw in [0, 1)


class Candidates(NamedTuple):
    """A row's drawable tokens: ids, their logits, and the softmax mass of the row's other
    tokens relative to its peak (the row's top-p normaliser when the cut kept only a nucleus;
    0 when the candidates are all the chain would keep anyway)."""

    ids: np.ndarray
    logits: np.ndarray
    rest: float = 0.0


def draw(
    states: list[Chain],
    ids: np.ndarray,
    logits: np.ndarray,
    rest: np.ndarray | None = None,
    by_id: bool = False,
) -> list[int]:
    """Each row's token from its candidates ((rows, width) arrays, padded with logit -inf):
    greedy takes the row's largest logit (the lowest id on a tie); the others go through
    top-k -> top-p -> min-p -> temperature and one draw from their own RNG over the row
    sorted by logit, so a token depends on the row alone, not on its order or neighbours.
    ``by_id``: whole rows in id order, with no top-k or top-p to apply: drawn unsorted.

    A NaN logit (a model whose arithmetic overflowed) has no order: a row that holds one is
    drawn again with its NaNs as -inf (its RNG's next draw), so the token is one of the row's
    candidates, never padding (an id outside the vocabulary aborts llama.cpp at its first
    use), and never a NaN's while the row holds a number."""
    tokens = _draw(states, ids, logits, rest, by_id)
    if NO_ID in tokens:  # a Python scan of a short list: the usual tick pays no numpy call
        bad = np.array([i for i, token in enumerate(tokens) if token == NO_ID])
        clean = nan_as_lowest(logits[bad])
        with np.errstate(invalid="ignore"):  # a row of only -inf: its maths meets inf - inf
            again = _draw([states[i] for i in bad], ids[bad], clean,
                          None if rest is None else rest[bad], by_id)  # fmt: skip
        for i, token in zip(bad.tolist(), again, strict=True):
            tokens[i] = token
    return tokens


def nan_as_lowest(logits: np.ndarray) -> np.ndarray:
    """``logits`` with each NaN as -inf: how the chain orders a NaN (a copy)."""
    return np.where(np.isnan(logits), np.float32(-np.inf), logits)


def _draw(
    states: list[Chain],
    ids: np.ndarray,
    logits: np.ndarray,
    rest: np.ndarray | None,
    by_id: bool,
) -> list[int]:
    if not by_id:
        return _draw_sorted(states, ids, logits, rest)
    greedy = [s.chain[3] <= 0.0 for s in states]  # temperature 0
    if all(greedy):
        return _argmax(ids, logits).tolist()
    if not any(greedy):
        return _sample_unsorted(states, ids, logits).tolist()
    g = np.array(greedy)
    tokens = np.empty(len(states), dtype=np.int64)
    tokens[g] = _argmax(ids[g], logits[g])
    sampled = [s for s, gr in zip(states, greedy, strict=True) if not gr]
    tokens[~g] = _sample_unsorted(sampled, ids[~g], logits[~g])
    return tokens.tolist()


def _draw_sorted(
    states: list[Chain], ids: np.ndarray, logits: np.ndarray, rest: np.ndarray | None
) -> list[int]:
    """draw.c's draw: top-k and top-p keep a prefix of the row sorted by logit (ties in
    column order), min-p those within a ratio of the peak; then one inverse-CDF draw along the
    row with the sequence's next uniform (a greedy row takes none)."""
    rows, width = logits.shape
    if not width:
        raise ValueError("a row without candidates to draw from")
    chains = [s.chain for s in states]
    uniforms = [s.uniform() if c[3] > 0.0 else 0.0 for s, c in zip(states, chains, strict=True)]
    ids = np.ascontiguousarray(ids, dtype=np.int32 if ids.dtype == np.int32 else np.int64)
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    at = _scratch(rows)
    at.chains[:rows], at.uniforms[:rows] = chains, uniforms
    if rest is not None:
        at.rests[:rows] = rest
    if _native(rows, width, ids.ctypes.data, ids.itemsize == 8, logits.ctypes.data,
               at.addresses[0], None if rest is None else at.addresses[1], at.addresses[2],
               at.addresses[3]) != 0:  # fmt: skip
        raise MemoryError("draw.c: no memory for a tick's draw")
    return at.tokens[:rows].tolist()


class _Scratch:
    """draw.c's parameter and result arrays, kept from tick to tick with their addresses (a
    ``.ctypes.data`` costs ~1 us; a lone row's whole draw ~8 us on the 2-core CPU)."""

    def __init__(self, rows: int) -> None:
        self.chains, self.rests = np.zeros((rows, 4)), np.zeros(rows)
        self.uniforms, self.tokens = np.zeros(rows), np.zeros(rows, dtype=np.int64)
        arrays = (self.chains, self.rests, self.uniforms, self.tokens)
        self.addresses = tuple(a.ctypes.data for a in arrays)


_local = threading.local()  # a scratch a thread: each engine thread draws on its own


def _scratch(rows: int) -> _Scratch:
    at: _Scratch | None = getattr(_local, "scratch", None)
    if at is None or len(at.tokens) < rows:
        at = _local.scratch = _Scratch(max(rows, 64))
    return at


def _argmax(ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
    tie = logits == np.maximum.reduce(logits, axis=1, keepdims=True)
    return np.minimum.reduce(np.where(tie, ids, NO_ID), axis=1)


def _sample_unsorted(states: list[Chain], ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """Whole rows in id order (no top-k or top-p to apply): min-p keeps those within a ratio
    of the peak, then one inverse-CDF draw along the row in id order. Written for few numpy
    calls: they, not the data, are the cost."""
    rows, width = logits.shape
    log_min_p, temperature = _columns(states)
    starts = count(rows)[:, None] * width  # each row's start in the flat arrays
    cand = logits.astype(np.float64)
    # ufuncs' own reduce and accumulate: ndarray.max, .sum and np.cumsum add Python layers
    peak = np.maximum.reduce(cand, axis=1, keepdims=True)
    cand -= peak  # the row's peak is 0
    w = np.exp(cand / temperature) * (cand >= log_min_p)  # min-p: p >= min_p * p_max
    cw = np.add.accumulate(w, axis=1)
    u = np.array([s.uniform() for s in states])[:, None] * cw[:, -1:]
    pick = np.add.reduce(cw <= u, axis=1)
    if np.maximum.reduce(pick) >= width:  # u rounded up to the total: the last kept token
        pick = np.minimum(pick, width - 1 - np.argmax(w[:, ::-1] > 0, axis=1))
    tokens = ids.ravel()[pick + starts[:, 0]]
    nan = [r for r, x in enumerate(peak.ravel().tolist()) if x != x]
    if nan:  # a NaN logit: ``draw`` draws the row again, the NaN as -inf
        tokens[nan] = NO_ID
    return tokens


def _columns(states: list[Chain]) -> tuple[Any, Any]:
    """The rows' log min-p and temperature as (rows, 1) columns, or as numbers when every
    row has the same ones (the usual tick)."""
    pairs = [s.chain[1::2] for s in states]
    if pairs.count(pairs[0]) == len(pairs):
        return pairs[0]
    log_min_p, temperature = np.array(pairs).T[:, :, None]
    return log_min_p, temperature


def stack(cands: list[Candidates]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of candidates as one (rows, width) array pair, padded with logit -inf."""
    if len(cands) == 1:  # nothing to pad (a verified draft's row, a lone stream)
        (c,) = cands
        return c.ids[None], c.logits[None], np.array([c.rest])
    width = max(len(c.ids) for c in cands)
    ids = np.full((len(cands), width), NO_ID, dtype=np.int64)
    logits = np.full((len(cands), width), -np.inf, dtype=np.float32)
    for r, c in enumerate(cands):
        ids[r, : len(c.ids)], logits[r, : len(c.ids)] = c.ids, c.logits
    return ids, logits, np.array([c.rest for c in cands])
