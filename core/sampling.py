"""Token sampling straight from llama.cpp's logits rows, without vocabulary-sized candidate
arrays where none is needed.

llama.cpp's sampler chain builds a 262,144-entry candidate array per sequence and token for
the default model (~0.3 ms here, ~0.7 ms on a GPU host's CPU). Here a row is a numpy view on
the context's logits buffer (no copy): greedy is one argmax; top-k / top-p / min-p find their
candidates by partial selection (argpartition) and normalise with one vectorised log-sum-exp,
so only the candidates are ever sorted. The chain's order and maths are kept: logit bias ->
penalties -> top-k -> top-p -> min-p -> temperature -> draw, so greedy output is token-identical to
llama.cpp's and sampled output follows the same distribution (seeded per request with
numpy's PCG64, so the exact draws differ from llama.cpp's mt19937).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import numpy as np

from uma_serve.core import protocol as p
from uma_serve.core.runtime import SamplingParams

BLOCK = 512  # vocabulary block for the two-level draw over the whole row


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


class TokenSampler:
    """One session's sampler: its parameters, its RNG and the history penalties look at."""

    def __init__(self, params: SamplingParams, default_seed: int) -> None:
        self.p = params
        seed = params.seed if params.seed is not None else default_seed
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.history: deque[int] = deque(maxlen=max(params.penalty_last_n, 0))
        self.penalized = (
            params.repeat_penalty != 1.0
            or params.frequency_penalty != 0.0
            or params.presence_penalty != 0.0
        )
        self.bias_ids = np.array([t for t, _ in params.logit_bias], dtype=np.int64)
        self.bias = np.array([b for _, b in params.logit_bias], dtype=np.float32)

    def free(self) -> None:
        """Nothing native to free (same interface as runtime.Sampler)."""

    def accept(self, token: int) -> None:
        if self.history.maxlen:
            self.history.append(token)

    def _apply_bias(self, logits: np.ndarray) -> None:
        """In place, first in the chain (as llama.cpp's common sampler and llama-server)."""
        if len(self.bias_ids):
            logits[self.bias_ids] += self.bias

    def _apply_penalties(self, logits: np.ndarray) -> None:
        """In place on the row (the buffer is rewritten by the next decode), as llama.cpp."""
        if not (self.penalized and self.history):
            return
        ids, counts = np.unique(np.fromiter(self.history, dtype=np.int64), return_counts=True)
        vals = logits[ids]
        p = self.p
        vals = np.where(vals <= 0, vals * p.repeat_penalty, vals / p.repeat_penalty)
        vals -= counts * p.frequency_penalty + p.presence_penalty
        logits[ids] = vals

    def sample(self, logits: np.ndarray) -> int:
        self._apply_bias(logits)
        self._apply_penalties(logits)
        p = self.p
        token = int(np.argmax(logits)) if p.temperature <= 0.0 else self._draw(logits)
        self.accept(token)
        return token

    def needs_full_row(self, device_k: int) -> bool:
        """True when a device top-k of ``device_k`` cannot stand in for the whole row: a
        logit bias or penalties change logits before any truncation, and a wider top-k (or
        none) when sampling needs tokens the device dropped."""
        if self.penalized or len(self.bias_ids):
            return True
        return self.p.temperature > 0.0 and not (0 < self.p.top_k <= device_k)

    def sample_candidates(self, ids: np.ndarray, logits: np.ndarray) -> int:
        """The token from a device top-k (ids, logits): the chain's maths from top-k on, so
        the same law as sampling the whole row (greedy: the same token). One row alone costs
        half as many numpy calls here as in sample_candidates_batch."""
        p = self.p
        if p.temperature <= 0.0:
            best = logits.max()
            token = int(ids[logits == best].min())  # the row's argmax: lowest id on a tie
        else:
            order = np.argsort(logits)[::-1][: p.top_k if p.top_k > 0 else None]
            ids, cand = ids[order], logits[order].astype(np.float64)
            if p.top_p < 1.0:
                keep = int(np.searchsorted(np.cumsum(_softmax(cand)), p.top_p) + 1)
                ids, cand = ids[:keep], cand[:keep]
            if p.min_p > 0.0:
                mask = cand >= cand[0] + np.log(p.min_p)
                ids, cand = ids[mask], cand[mask]
            probs = _softmax(cand / p.temperature)
            pick = int(np.searchsorted(np.cumsum(probs), self.rng.random() * probs.sum()))
            token = int(ids[min(pick, len(probs) - 1)])
        self.accept(token)
        return token

    def _draw(self, logits: np.ndarray) -> int:
        p = self.p
        n = logits.shape[0]
        peak = float(logits.max())
        log_norm = None  # normaliser of the top-p probabilities: the candidates' own ...
        if 0 < p.top_k < n:
            ids = top_k_ids(logits, p.top_k, peak)
        elif p.top_p < 1.0:
            ids, log_norm = nucleus_ids(logits, p.top_p, peak)  # ... or the whole row's
        else:
            ids = None  # the whole vocabulary
        cand = logits if ids is None else logits[ids]
        if p.top_p < 1.0 and ids is not None:
            order = np.argsort(cand)[::-1]
            ordered = cand[order].astype(np.float64)
            probs = _softmax(ordered) if log_norm is None else np.exp(ordered - log_norm)
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
            ids, cand = ids[order[:keep]], cand[order[:keep]]
        if p.min_p > 0.0:  # p >= min_p * p_max  <=>  logit >= max + ln(min_p)
            mask = cand >= float(cand.max()) + np.log(p.min_p)
            ids = np.flatnonzero(mask) if ids is None else ids[mask]
            cand = cand[mask]
        if ids is None:
            return self._draw_full(logits, peak)
        probs = _softmax(cand.astype(np.float64) / p.temperature)
        pick = int(np.searchsorted(np.cumsum(probs), self.rng.random() * probs.sum()))
        return int(ids[min(pick, len(probs) - 1)])

    def _draw_full(self, logits: np.ndarray, peak: float) -> int:
        """An exact draw from softmax(logits / T) over the whole vocabulary: one float32 exp
        pass, then a two-level inverse CDF (block sums, then one block), never a
        vocabulary-sized float64 array."""
        w = np.exp((logits - np.float32(peak)) / np.float32(self.p.temperature))
        starts = np.arange(0, w.shape[0], BLOCK)
        blocks = np.add.reduceat(w, starts).astype(np.float64)
        cum = np.cumsum(blocks)
        u = self.rng.random() * cum[-1]
        b = min(int(np.searchsorted(cum, u, side="right")), len(blocks) - 1)
        inner = np.cumsum(w[starts[b] : starts[b] + BLOCK], dtype=np.float64)
        rest = u - (cum[b - 1] if b else 0.0)
        i = min(int(np.searchsorted(inner, rest, side="right")), len(inner) - 1)
        return int(starts[b] + i)


def sample_candidates_batch(
    samplers: list[TokenSampler], ids: np.ndarray, logits: np.ndarray
) -> list[int]:
    """Each session's token from its row of device candidates ((rows, k) arrays, unsorted;
    padding has logit -inf), all rows in one set of numpy calls: per row the chain's maths
    from top-k on (top-k -> top-p -> min-p -> temperature -> one draw from the row's RNG):
    16 rows cost what 3-4 cost one by one (the numpy calls, not the data, are the cost).
    Greedy: the row's argmax, the lowest id on a tie."""
    if len(samplers) == 1:
        return [samplers[0].sample_candidates(ids[0], logits[0])]
    tokens = [0] * len(samplers)
    greedy = [i for i, s in enumerate(samplers) if s.p.temperature <= 0.0]
    drawn = [i for i, s in enumerate(samplers) if s.p.temperature > 0.0]
    if greedy:
        g, gi = (logits, ids) if not drawn else (logits[greedy], ids[greedy])
        tie = g == g.max(axis=1, keepdims=True)
        best = np.where(tie, gi, np.iinfo(np.int32).max).min(axis=1)
        for i, token in zip(greedy, best.tolist(), strict=True):
            tokens[i] = token
    if drawn:
        d, di = (logits, ids) if not greedy else (logits[drawn], ids[drawn])
        picks = _draw_rows([samplers[i] for i in drawn], di, d)
        for i, token in zip(drawn, picks.tolist(), strict=True):
            tokens[i] = token
    for sampler, token in zip(samplers, tokens, strict=True):
        sampler.accept(token)
    return tokens


def _draw_rows(samplers: list[TokenSampler], ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """Each kept set is a prefix of its row sorted by logit: n counts it, step by step."""
    rows, k = logits.shape
    at = np.arange(rows)[:, None]
    order = np.argsort(logits, axis=1)[:, ::-1]
    ids = ids[at, order]
    cand = logits[at, order].astype(np.float64)
    cand -= cand[:, :1]  # the row's max is 0
    params = [s.p for s in samplers]
    n = np.array([p.top_k if 0 < p.top_k < k else k for p in params])
    top_p = np.array([p.top_p for p in params])
    floor = np.array([math.log(p.min_p) if p.min_p > 0.0 else -math.inf for p in params])
    col = np.arange(k)
    e = np.exp(cand)
    e[col >= n[:, None]] = 0.0
    mass = np.cumsum(e, axis=1)
    nucleus = (mass < top_p[:, None] * mass[:, -1:]).sum(axis=1) + 1  # first prefix >= top_p
    n = np.where(top_p < 1.0, np.minimum(n, nucleus), n)
    n = np.minimum(n, (cand >= floor[:, None]).sum(axis=1))  # min-p: p >= min_p * p_max
    w = np.exp(cand / np.array([p.temperature for p in params])[:, None])
    w[col >= n[:, None]] = 0.0
    cw = np.cumsum(w, axis=1)
    u = np.array([s.rng.random() for s in samplers]) * cw[:, -1]
    pick = np.minimum((cw < u[:, None]).sum(axis=1), n - 1)
    return ids[at[:, 0], pick]


def top_k_ids(logits: np.ndarray, k: int, peak: float) -> np.ndarray:
    """The k largest logits' ids: a threshold pass keeps the few near the peak, and only those
    are partitioned (argpartition over the whole row is twice as slow)."""
    for gap in (4.0, 8.0, 16.0):
        ids = np.flatnonzero(logits >= peak - gap)
        if len(ids) >= k:
            break
    else:
        ids = np.arange(logits.shape[0])
    if len(ids) > k:
        ids = ids[np.argpartition(logits[ids], len(ids) - k)[len(ids) - k :]]
    return ids


def nucleus_ids(logits: np.ndarray, top_p: float, peak: float) -> tuple[np.ndarray, float]:
    """Tokens near the peak holding top_p of the probability mass (so the nucleus lies among
    them), and log of the whole row's softmax normaliser, so the nucleus is exactly
    llama.cpp's."""
    w = np.exp(logits - np.float32(peak))
    log_norm = peak + float(np.log(w.sum(dtype=np.float64)))
    norm = np.exp(log_norm - peak)
    for gap in (2.0, 4.0, 8.0, 16.0, 32.0):
        ids = np.flatnonzero(logits >= peak - gap)
        if float(w[ids].sum(dtype=np.float64)) / norm >= top_p:
            return ids, log_norm
    return np.arange(logits.shape[0]), log_norm


def logprobs_of(raw: np.ndarray, token: int, k: int, piece: Callable[[int], bytes]) -> p.Logprobs:
    """The model's log-probabilities (log-softmax of the raw logits, before any sampling step)
    of ``token`` and of the ``k`` most likely tokens, most likely first."""
    peak = float(raw.max())
    lse = peak + math.log(float(np.exp(raw - np.float32(peak)).sum(dtype=np.float64)))
    top: list[p.TokenLogprob] = []
    if k > 0:
        ids = top_k_ids(raw, k, peak)
        ids = ids[np.argsort(-raw[ids], kind="stable")]
        top = [p.TokenLogprob(int(i), float(raw[i]) - lse, piece(int(i))) for i in ids]
    return p.Logprobs(p.TokenLogprob(token, float(raw[token]) - lse, piece(token)), top)
