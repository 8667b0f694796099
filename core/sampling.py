"""The engine's one sampler: each row of a decode to its token, through one batched chain.

Every token goes through one chain: logit bias -> penalties -> top-k -> top-p -> min-p ->
temperature -> draw, in llama.cpp's order and with its maths, so greedy output is
token-identical to llama.cpp's and sampled output follows the same law (seeded per sequence
with numpy's PCG64, so the draws themselves differ from llama.cpp's mt19937; the tests compare
with llama.cpp's own chain, tests/llama_chain.py).

A row enters the chain as candidates. With a device top-k (the default on a GPU) the device
keeps each row's best ``device_top_k`` logits and only they cross to the host, unless the
request needs its whole row (a bias, penalties, a wider top-k, logprobs): that sequence's
device top-k is detached, a whole-row chain in its place, so that only its row crosses (and
stays so until a request that can use it gets the sequence, see ``Sampler.chains``). A
grammar's request gets a wider device top-k instead, ``GRAMMAR_TOP_K``, from which the
grammar's allowed tokens are searched where it refuses the model's draw (core/runtime/
grammar.py). A whole row (every row on a CPU)
is biased and penalised in place, then cut to what can be drawn (greedy: the argmax; top-k:
the k best; top-p alone: the tokens near the peak that hold the nucleus; else the whole row),
never sorting the vocabulary. From there the rows are drawn together (core/draw.py). A
grammar's request keeps its drawn token when the grammar allows it, else draws again from the
allowed tokens (as llama.cpp's common sampler does).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from uma_serve.core import protocol as p
from uma_serve.core.draw import Candidates, draw, nan_as_lowest, stack
from uma_serve.core.runtime.api import Constraint as Constraint, RuntimeApi

PENALTY_LAST_N = 64  # tokens the penalties look back over (llama.cpp's default)
# the device's candidates a grammar's row hands over: along grammar-mix's JSON answers (Gemma
# 3 270M, T = 0.8) the grammar refused 79 of 245 draws, and the row's best 64 / 1,024 /
# 4,096 / 16,384 tokens settled 49 / 71 / 77 / 78 of those searches as the whole row would
# (forced tool calls: 104 refusals, 90 settled by 16,384; docs/BENCHMARKS.md); a whole row
# is 262,144 tokens, 1 MB to copy and pass over
GRAMMAR_TOP_K = 16384
UNIFORM_BATCH = 64  # a sequence's random draws made at once (core/draw.py takes one a token)
# an impossible token's logprob, as OpenAI and vLLM give it (JSON has no -inf), and a NaN
# row's (a model whose arithmetic overflowed): a NaN would go out as null, which no client
# decodes as a float
LOGPROB_FLOOR = -9999.0


class SamplerState:
    """One sequence's sampling: its parameters (the request's own, core/protocol.py), RNG, the
    history penalties look at, and its grammar; ``device_k``: the candidates its device
    chain hands over (0: its whole logits row)."""

    def __init__(
        self, params: p.Sampling, default_seed: int, grammar: Constraint | None = None
    ) -> None:
        self.p = params
        seed = params.seed if params.seed is not None else default_seed
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self._uniforms: list[float] = []  # the RNG's next draws, next one last
        self.history: deque[int] = deque(maxlen=PENALTY_LAST_N)
        self.penalized = (
            params.repeat_penalty != 1.0
            or params.frequency_penalty != 0.0
            or params.presence_penalty != 0.0
        )
        bias = params.logit_bias or {}
        self.bias_ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        self.bias = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        self.grammar = grammar
        self.device_k = 0
        # the draw's parameters as one tuple (top-k as a width: none is any width)
        self.chain = (
            params.top_k if params.top_k > 0 else math.inf,
            math.log(params.min_p) if params.min_p > 0.0 else -math.inf,
            params.top_p,
            params.temperature,
        )

    def uniform(self) -> float:
        """The RNG's next draw in [0, 1): the stream of one ``rng.random()`` a token, made
        UNIFORM_BATCH at a time (64 cost 1.3 us at once against 37 us one by one)."""
        if not self._uniforms:
            self._uniforms = self.rng.random(UNIFORM_BATCH)[::-1].tolist()
        return self._uniforms.pop()

    def accept(self, token: int) -> None:
        if self.history.maxlen:
            self.history.append(token)
        if self.grammar is not None:
            self.grammar.accept(token)

    def free(self) -> None:
        """Its grammar's memory back (a state freed while its tick computes samples freely)."""
        if self.grammar is not None:
            self.grammar.free()
            self.grammar = None

    def prepare(self, row: np.ndarray) -> None:
        """Bias then penalties, in place on a whole row (the next decode rewrites it)."""
        if len(self.bias_ids):
            row[self.bias_ids] += self.bias
        if self.penalized and self.history:
            ids, counts = np.unique(np.fromiter(self.history, dtype=np.int64), return_counts=True)
            vals = row[ids]
            prm = self.p
            vals = np.where(vals <= 0, vals * prm.repeat_penalty, vals / prm.repeat_penalty)
            vals -= counts * prm.frequency_penalty + prm.presence_penalty
            row[ids] = vals

    def cut(self, row: np.ndarray) -> Candidates:
        """The prepared row's candidates: what the chain's truncations can keep."""
        prm = self.p
        if prm.temperature <= 0.0:
            best = np.argmax(row, keepdims=True)  # the first maximum: the lowest id on a tie
            if row[best[0]] != row[best[0]]:  # a NaN, which argmax takes for the maximum
                best = np.argmax(nan_as_lowest(row), keepdims=True)
            return Candidates(best, row[best])
        peak = float(row.max())
        if 0 < prm.top_k < row.shape[0]:
            ids = top_k_ids(row, prm.top_k, peak)
            return Candidates(ids, row[ids])
        if prm.top_p < 1.0:
            ids, log_norm = nucleus_ids(row, prm.top_p, peak)
            mass = float(np.exp(row[ids] - np.float32(peak)).sum(dtype=np.float64))
            rest = max(math.exp(log_norm - peak) - mass, 0.0) if len(ids) < row.shape[0] else 0.0
            return Candidates(ids, row[ids], rest)
        return Candidates(np.arange(row.shape[0]), row)


def needs_full_row(params: p.Sampling, device_k: int, logprobs: bool = False) -> bool:
    """True when a device top-k of ``device_k`` cannot stand in for the whole row: a bias or
    penalties change logits before any cut, logprobs are the row's, and a wider top-k (or
    none) needs tokens the device dropped."""
    penalized = (
        params.repeat_penalty != 1.0
        or params.frequency_penalty != 0.0
        or params.presence_penalty != 0.0
    )
    if logprobs or penalized or params.logit_bias:
        return True
    return params.temperature > 0.0 and not (0 < params.top_k <= device_k)


def device_chain(req: p.Generate, device_k: int) -> int:
    """The candidates a request's device chain hands over: ``device_k``, GRAMMAR_TOP_K for a
    grammar's request, 0 (the whole row) where those cannot stand in for it. Sampled without
    min-p, a grammar's search may have to reach tokens ~17 logits below the best allowed one
    (core/runtime/grammar.py), deeper than the device's candidates go: its whole row."""
    logprobs = req.logprobs is not None
    if req.grammar is None:
        return 0 if needs_full_row(req, device_k, logprobs) else device_k
    if needs_full_row(req, GRAMMAR_TOP_K, logprobs) or (req.temperature > 0 and not req.min_p):
        return 0
    return GRAMMAR_TOP_K


def top_k_ids(logits: np.ndarray, k: int, peak: float) -> np.ndarray:
    """The k largest logits' ids: a threshold pass keeps the few near the peak, and only those
    are partitioned (argpartition over the whole row is twice as slow). Each pass over a
    262,144-token row costs ~65 us; 8 below the peak holds ~70 tokens at the median (under
    3,000 at most) of Gemma 3's rows, enough for the usual top-k of 40 in one pass."""
    for gap in (8.0, 16.0):
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
        top = [p.TokenLogprob(int(i), _floored(float(raw[i]) - lse), piece(int(i))) for i in ids]
    return p.Logprobs(p.TokenLogprob(token, _floored(float(raw[token]) - lse), piece(token)), top)


def _floored(logprob: float) -> float:
    return logprob if logprob >= LOGPROB_FLOOR else LOGPROB_FLOOR  # -inf and NaN: the floor


class Row(NamedTuple):
    """One decode row to sample: its sequence's state, its row in the decode's outputs and the
    number of top logprobs the request wants (None: no logprobs)."""

    state: SamplerState
    row: int
    logprobs: int | None = None


class Sampler:
    """Samples a decode's rows; owns each sequence's device chain."""

    def __init__(self, runtime: RuntimeApi) -> None:
        self.runtime = runtime
        self.device_k = runtime.params.device_top_k  # > 0: candidates come from the device
        # Sequence ids whose device chain is not the usual top-k, by the candidates it hands
        # over (device_chain). Each change costs llama.cpp a graph reservation (60-130 ms on
        # an H100, every stream waits), so an id keeps its chain after its request, and
        # admission gives a request a free id whose chain suits it when there is one
        # (``suits``).
        self.chains: dict[int, int] = {}
        self._changes: dict[int, int] = {}  # seq_id -> its chain before a change not applied

    def _chain(self, seq_id: int) -> int:
        return self.chains.get(seq_id, self.device_k)

    def suits(self, req: p.Generate) -> Callable[[int], bool] | None:
        """Which sequence ids ``req`` can take without a change of chain (None: any)."""
        if not self.device_k:
            return None
        k = device_chain(req, self.device_k)
        return lambda seq_id: self._chain(seq_id) == k

    def new(self, seq_id: int, req: p.Generate, default_seed: int) -> SamplerState:
        """A request's sampling state on ``seq_id``; a change of the id's device top-k waits
        for ``apply`` (a tick may be computing with the id's current one)."""
        grammar = None if req.grammar is None else self.runtime.grammar(req.grammar)
        state = SamplerState(req, default_seed, grammar)
        if not self.device_k:
            return state
        k = state.device_k = device_chain(req, self.device_k)
        if k != self._chain(seq_id):
            self._changes.setdefault(seq_id, self._chain(seq_id))
            if k == self.device_k:
                del self.chains[seq_id]
            else:
                self.chains[seq_id] = k
            if self._changes[seq_id] == k:  # it undoes a pending change
                del self._changes[seq_id]
        return state

    def apply(self) -> None:
        """Make the device chain changes ``new`` decided (call with no decode in flight)."""
        for seq_id in self._changes:
            self.runtime.set_device_chain(seq_id, self._chain(seq_id))
        self._changes.clear()

    def release(self, state: SamplerState | None) -> None:
        if state is not None:
            state.free()

    def sample(self, rows: list[Row]) -> list[tuple[int, p.Logprobs | None]]:
        """The tokens of a tick's rows, and each one's logprobs when its request asks."""
        # the model's own rows, before bias and penalties change them in place
        raw = [None if r.logprobs is None else self._row(r).copy() for r in rows]
        tokens, wide = self._draw(rows)
        refused = [i for i, r in enumerate(rows) if not self._allows(r, tokens[i])]
        if refused:  # a grammar's second draw, from the tokens it allows
            states = [rows[i].state for i in refused]
            allowed = [Candidates(*self._allowed(rows[i], wide.get(i))) for i in refused]
            for i, token in zip(refused, draw(states, *stack(allowed)), strict=True):
                tokens[i] = token
        out: list[tuple[int, p.Logprobs | None]] = []
        for r, token, row in zip(rows, tokens, raw, strict=True):
            r.state.accept(token)
            k = r.logprobs or 0
            out.append((token, None if row is None else logprobs_of(row, token, k, self._piece)))
        return out

    def _draw(self, rows: list[Row]) -> tuple[list[int], dict[int, Candidates]]:
        """Every row's first draw: device rows as the device gave them, host rows prepared and
        cut; rows as wide as the vocabulary apart, so the others are not padded to it. Also
        the grammar rows' device candidates, by their index in ``rows``."""
        tokens = [0] * len(rows)
        device = [i for i, r in enumerate(rows) if r.state.device_k == self.device_k > 0]
        if device:
            ids, logits = self.runtime.candidates([rows[i].row for i in device])
            picks = draw([rows[i].state for i in device], ids, logits)
            for i, token in zip(device, picks, strict=True):
                tokens[i] = token
        host: dict[bool, list[tuple[int, Candidates]]] = {}
        wide: dict[int, Candidates] = {}
        for i, r in enumerate(rows):
            if not r.state.device_k:
                row = self._row(r)
                r.state.prepare(row)
                cut = r.state.cut(row)
                host.setdefault(len(cut.ids) == len(row), []).append((i, cut))
            elif r.state.device_k != self.device_k:  # a grammar's wider top-k, drawn whole
                wide[i] = Candidates(*self.runtime.wide_candidates(r.row, r.state.device_k))
                host.setdefault(False, []).append((i, wide[i]))
        for whole, group in host.items():
            states = [rows[i].state for i, _ in group]
            picks = draw(states, *stack([c for _, c in group]), by_id=whole)
            for (i, _), token in zip(group, picks, strict=True):
                tokens[i] = token
        return tokens, wide

    def _allowed(self, r: Row, wide: Candidates | None) -> tuple[np.ndarray, np.ndarray]:
        """The tokens a row's grammar allows, among its device candidates or its whole row."""
        assert r.state.grammar is not None
        if wide is not None:
            return r.state.grammar.allowed(wide.logits, r.state.p, wide.ids)
        return r.state.grammar.allowed(self._row(r), r.state.p)

    def _row(self, r: Row) -> np.ndarray:
        return self.runtime.logits_row(r.row)

    def _piece(self, token: int) -> bytes:
        return self.runtime.piece(token)

    @staticmethod
    def _allows(r: Row, token: int) -> bool:
        """Whether the row's grammar, if any, allows the token drawn without it."""
        grammar = r.state.grammar
        return grammar is None or grammar.allows_one(token)
