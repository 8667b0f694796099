"""The engine's one sampler: each row of a decode to its token, through one batched chain.

Where a row's candidates come from: with a device top-k (the default on a GPU, where the
device keeps each row's ``device_top_k`` best logits) from the device, unless the request
needs its whole row (a bias, penalties, a grammar, a wider top-k, logprobs): that sequence's
device top-k is detached for the request's life and its row read on the host. On a CPU every
row is a host row. The chain (core/sampling.py) then draws all rows together; a grammar's
request keeps its drawn token when the grammar allows it, else draws again from the allowed
tokens (as llama.cpp's common sampler does).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from uma_serve.core import protocol as p
from uma_serve.core.runtime.api import RuntimeApi
from uma_serve.core.runtime.params import SamplingParams
from uma_serve.core.sampling import Candidates, SamplerState, draw, logprobs_of, stack


class Row(NamedTuple):
    """One decode row to sample: its sequence's state, its row in the decode's outputs and the
    number of top logprobs the request wants (None: no logprobs)."""

    state: SamplerState
    row: int
    logprobs: int | None = None


def sampling_params(req: p.Generate) -> SamplingParams:
    return SamplingParams(
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        seed=req.seed,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        repeat_penalty=req.repeat_penalty,
        logit_bias=tuple(sorted((req.logit_bias or {}).items())),
    )


class Sampler:
    def __init__(self, runtime: RuntimeApi) -> None:
        self.runtime = runtime
        self.device_k = runtime.params.device_top_k  # > 0: candidates come from the device

    def new(self, seq_id: int, req: p.Generate, default_seed: int) -> SamplerState:
        grammar = None if req.grammar is None else self.runtime.grammar(req.grammar)
        state = SamplerState(sampling_params(req), default_seed, grammar)
        if self.device_k and (state.needs_full_row(self.device_k) or req.logprobs is not None):
            self.runtime.set_device_top_k(seq_id, False)
            state.full_row = True
        return state

    def release(self, seq_id: int, state: SamplerState | None) -> None:
        if state is None:
            return
        state.free()
        if state.full_row:  # give the sequence its device top-k back
            self.runtime.set_device_top_k(seq_id, True)

    def sample(self, rows: list[Row]) -> list[tuple[int, p.Logprobs | None]]:
        """The tokens of a tick's rows, and each one's logprobs when its request asks."""
        # the model's own rows, before bias and penalties change them in place
        raw = [None if r.logprobs is None else self._row(r).copy() for r in rows]
        tokens = self._draw(rows)
        refused = [i for i, r in enumerate(rows) if not self._allows(r, tokens[i])]
        if refused:  # a grammar's second draw, from the tokens it allows
            states = [rows[i].state for i in refused]
            allowed = [Candidates(*s.grammar.allowed(self._row(rows[i]), s.p))  # type: ignore[union-attr]
                       for i, s in zip(refused, states, strict=True)]  # fmt: skip
            for i, token in zip(refused, draw(states, *stack(allowed)), strict=True):
                tokens[i] = token
        out: list[tuple[int, p.Logprobs | None]] = []
        for r, token, row in zip(rows, tokens, raw, strict=True):
            r.state.accept(token)
            k = r.logprobs or 0
            out.append((token, None if row is None else logprobs_of(row, token, k, self._piece)))
        return out

    def _draw(self, rows: list[Row]) -> list[int]:
        """Every row's first draw: device rows as the device gave them, host rows prepared and
        cut; rows as wide as the vocabulary apart, so the others are not padded to it."""
        tokens = [0] * len(rows)
        device = [i for i, r in enumerate(rows) if self.device_k and not r.state.full_row]
        if device:
            ids, logits = self.runtime.candidates([rows[i].row for i in device])
            picks = draw([rows[i].state for i in device], ids, logits)
            for i, token in zip(device, picks, strict=True):
                tokens[i] = token
        host: dict[bool, list[tuple[int, Candidates]]] = {}
        for i, r in enumerate(rows):
            if not self.device_k or r.state.full_row:
                row = self._row(r)
                r.state.prepare(row)
                cut = r.state.cut(row)
                host.setdefault(len(cut.ids) == len(row), []).append((i, cut))
        for whole, group in host.items():
            states = [rows[i].state for i, _ in group]
            picks = draw(states, *stack([c for _, c in group]), by_id=whole)
            for (i, _), token in zip(group, picks, strict=True):
                tokens[i] = token
        return tokens

    def _row(self, r: Row) -> np.ndarray:
        return self.runtime.logits_row(r.row)

    def _piece(self, token: int) -> bytes:
        return self.runtime.piece(token)

    @staticmethod
    def _allows(r: Row, token: int) -> bool:
        """Whether the row's grammar, if any, allows the token drawn without it."""
        grammar = r.state.grammar
        return grammar is None or bool(
            grammar.allows(np.array([token]), np.zeros(1, np.float32))[0]
        )
