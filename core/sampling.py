"""Token sampling straight from llama.cpp's logits rows, without vocabulary-sized candidate
arrays where none is needed.

llama.cpp's sampler chain builds a 262,144-entry candidate array per sequence and token for
the default model (~0.3 ms here, ~0.7 ms on a GPU host's CPU). Here a row is a numpy view on
the context's logits buffer (no copy): greedy is one argmax; top-k / top-p / min-p find their
candidates by partial selection (argpartition) and normalise with one vectorised log-sum-exp,
so only the candidates are ever sorted. The chain's order and maths are kept: penalties ->
top-k -> top-p -> min-p -> temperature -> draw, so greedy output is token-identical to
llama.cpp's and sampled output follows the same distribution (seeded per request with
numpy's PCG64, so the exact draws differ from llama.cpp's mt19937).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from uma_serve.core.runtime import SamplingParams

NUCLEUS_PROBE = 256  # candidates examined first for top-p; doubled until the mass is reached


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

    def free(self) -> None:
        """Nothing native to free (same interface as runtime.Sampler)."""

    def accept(self, token: int) -> None:
        if self.history.maxlen:
            self.history.append(token)

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
        self._apply_penalties(logits)
        p = self.p
        token = int(np.argmax(logits)) if p.temperature <= 0.0 else self._draw(logits)
        self.accept(token)
        return token

    def _draw(self, logits: np.ndarray) -> int:
        p = self.p
        n = logits.shape[0]
        log_norm = None  # normaliser of the top-p probabilities: the candidates' own
        if 0 < p.top_k < n:
            ids = np.argpartition(logits, n - p.top_k)[n - p.top_k :]
        elif p.top_p < 1.0:
            ids, log_norm = self._nucleus_candidates(logits)  # ... or the whole row's
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
            mask = cand >= cand.max() + np.log(p.min_p)
            ids = np.flatnonzero(mask) if ids is None else ids[mask]
            cand = cand[mask]
        probs = _softmax(cand.astype(np.float64) / p.temperature)
        pick = int(np.searchsorted(np.cumsum(probs), self.rng.random() * probs.sum()))
        pick = min(pick, len(probs) - 1)
        return int(pick if ids is None else ids[pick])

    def _nucleus_candidates(self, logits: np.ndarray) -> tuple[np.ndarray, float]:
        """The top-m tokens (m = 256, 1024, ...) that hold top_p of the probability mass, and
        log of the whole row's softmax normaliser, so the nucleus is exactly llama.cpp's."""
        n = logits.shape[0]
        peak = float(logits.max())
        log_norm = peak + float(np.log(np.exp(logits - peak, dtype=np.float64).sum()))
        m = NUCLEUS_PROBE
        while m < n:
            ids = np.argpartition(logits, n - m)[n - m :]
            mass = float(np.exp(logits[ids].astype(np.float64) - log_norm).sum())
            if mass >= self.p.top_p:
                return ids, log_norm
            m *= 4
        return np.arange(n), log_norm
