"""The chain's draw: each row's token from its candidates, as (rows, width) arrays.

Greedy rows take their largest logit (the lowest id on a tie); the others go through top-k ->
top-p -> min-p -> temperature and one draw from their own RNG along the row sorted by logit,
with llama.cpp's maths (core/sampling.py turns a decode's rows into candidates). Rows are drawn
together with one set of numpy calls: 16 rows cost what 5 cost one by one (the calls, not
the data, are the cost, so reductions call the ufuncs' own ``reduce`` and ``accumulate``,
which skip numpy's Python wrappers: a quarter of a tick's draw); up to ``ROW_BY_ROW`` rows
(a lone stream's tick) are drawn one by one with a third of the calls, the same tokens.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import numpy as np

from uma_serve.core.runtime.gil import count

NO_ID = np.iinfo(np.int32).max  # padding's id; never drawn (its logit is -inf)
# rows drawn one by one rather than together: 2 rows 20 against 29 us, 3 rows 30 against 32,
# 4 rows 40 against 34 (the 2-core CPU; on an H100 host a lone stream's tick gained ~0.1 ms)
ROW_BY_ROW = 3
# candidates a tick sorts with a stable sort at most (16 rows of 64: 13 against 17 us)
STABLE_SORT_MAX = 1024


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
    greedy = [s.chain[3] <= 0.0 for s in states]  # temperature 0
    if all(greedy):
        return _argmax(ids, logits).tolist()
    if not any(greedy):
        return _sample(states, ids, logits, rest, not by_id).tolist()
    g = np.array(greedy)
    tokens = np.empty(len(states), dtype=np.int64)
    tokens[g] = _argmax(ids[g], logits[g])
    sampled = [s for s, gr in zip(states, greedy, strict=True) if not gr]
    tokens[~g] = _sample(sampled, ids[~g], logits[~g], None if rest is None else rest[~g],
                         not by_id)  # fmt: skip
    return tokens.tolist()


def _argmax(ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
    tie = logits == np.maximum.reduce(logits, axis=1, keepdims=True)
    return np.minimum.reduce(np.where(tie, ids, NO_ID), axis=1)


def _sample(
    states: list[Chain],
    ids: np.ndarray,
    logits: np.ndarray,
    rest: np.ndarray | None,
    ordered: bool,
) -> np.ndarray:
    """top-k and top-p keep a prefix of the row sorted by logit, min-p those within a ratio
    of the peak; then one inverse-CDF draw along the row. Written for few numpy calls: they,
    not the data, are the cost (16 rows cost what 5 cost one by one)."""
    rows, width = logits.shape
    if rows <= ROW_BY_ROW and ordered:
        rests = [0.0] * rows if rest is None else rest.tolist()
        return np.array([_sample_row(s, ids[r], logits[r], rests[r]) for r, s in enumerate(states)])
    top_k, log_min_p, top_p, temperature, nucleus = _columns(states)
    col = count(width)
    starts = count(rows)[:, None] * width  # each row's start in the flat arrays
    if ordered:
        # 1-D indexing: numpy lets the GIL go for a 2-D gather at any size (runtime/gil.py)
        order = (descending(logits) + starts).ravel()
        ids = ids.ravel()[order].reshape(rows, width)
        logits = logits.ravel()[order].reshape(rows, width)
    cand = logits.astype(np.float64)
    keep_k = col < top_k  # top-k (0 or none: the whole row)
    # ufuncs' own reduce and accumulate: ndarray.max, .sum and np.cumsum add Python layers
    peak = np.maximum.reduce(cand, axis=1, keepdims=True)
    cand -= peak  # the row's peak is 0
    keep = keep_k & (cand >= log_min_p)  # min-p: p >= min_p * p_max
    if nucleus:  # the first prefix of the top-k holding top_p of its mass
        mass = np.add.accumulate(np.exp(cand) * keep_k, axis=1)
        total = mass[:, -1:] if rest is None else mass[:, -1:] + rest[:, None]
        keep &= col <= np.add.reduce(mass < top_p * total, axis=1, keepdims=True)
    w = np.exp(cand / temperature) * keep
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


def _columns(states: list[Chain]) -> tuple[Any, Any, Any, Any, bool]:
    """The rows' chain parameters as (rows, 1) columns, or as numbers when every row has the
    same ones (the usual tick: 16 rows' columns cost ~6 us); and whether any row has a top-p."""
    chains = [s.chain for s in states]
    nucleus = min(c[2] for c in chains) < 1.0
    if chains.count(chains[0]) == len(chains):
        return (*chains[0], nucleus)
    top_k, log_min_p, top_p, temperature = np.array(chains).T[:, :, None]
    return top_k, log_min_p, top_p, temperature, nucleus


def _sample_row(state: Chain, ids: np.ndarray, logits: np.ndarray, rest: float) -> int:
    """``_sample`` for one row: the same steps on the kept prefix, a third of the numpy
    calls (11 against 25 us on the 2-core CPU), the same token."""
    top_k, log_min_p, top_p, temperature = state.chain
    order = (-logits).argsort(kind="stable")  # by logit, ties in column order
    last = logits[order[-1]]
    if last != last:  # a NaN (it sorts last): ``draw`` draws the row again
        state.uniform()  # the draw ``_sample`` takes for the row before it flags it
        return NO_ID
    cand = logits[order[: min(top_k, len(order))]].astype(np.float64)
    cand -= cand[0]
    n = int(np.count_nonzero(cand >= log_min_p))
    if not n:  # no finite peak (NaN or infinite logits): the row's first, as ``_sample``'s
        return int(ids[order[0]])
    if top_p < 1.0:
        mass = np.add.accumulate(np.exp(cand))
        n = min(n, int(np.count_nonzero(mass < top_p * (mass[-1] + rest))) + 1)
    w = np.exp(cand[:n] / temperature)
    cw = np.add.accumulate(w)
    pick = int(np.count_nonzero(cw <= state.uniform() * cw[-1]))
    if pick >= n:  # u rounded up to the total: the last kept token
        pick = n - 1 - int(np.argmax(w[::-1] > 0))
    return int(ids[order[pick]])


def descending(logits: np.ndarray) -> np.ndarray:
    """Each row's order by logit, largest first, ties in column order: a stable sort for a
    small tick (4 x 64: 4 against 10 us), else a quicksort of unique integer keys (64 x 64:
    39 against 89 us; float32 bits made monotonic, -0 as +0, the column in the low bits)."""
    if logits.size <= STABLE_SORT_MAX:
        return (-logits).argsort(axis=1, kind="stable")
    bits = (logits + np.float32(0.0)).view(np.int32).astype(np.int64)
    key = np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # ascending with the float
    col_bits = max(int(logits.shape[1] - 1).bit_length(), 1)
    return np.argsort(((-key) << col_bits) | count(logits.shape[1]), axis=1)


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
