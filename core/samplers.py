"""Which sampler a session gets, and where its token comes from after a decode.

Modes (``--sampler``; the daemon resolves ``auto``): ``numpy`` samples the logits row on the
host (core/sampling.py); ``backend-topk`` has the device keep a top-k per row and numpy
finish the chain on those candidates, except for requests that need the whole row
(penalties, a wider top-k, a grammar), whose sequence's device top-k is detached for their
lifetime; a request with a grammar samples on the host in every mode (core/grammar.py);
``llama`` runs llama.cpp's chain per session on the host; ``backend`` attaches that chain to
the context so the device draws the token.
"""

from __future__ import annotations

import numpy as np

from uma_serve.core import protocol as p
from uma_serve.core.config import SAMPLERS
from uma_serve.core.runtime import Runtime, Sampler, SamplingParams
from uma_serve.core.runtime.grammar import GrammarSampler
from uma_serve.core.sampling import TokenSampler, logprobs_of, sample_candidates_batch

AnySampler = TokenSampler | GrammarSampler | Sampler


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


class Samplers:
    def __init__(self, runtime: Runtime, mode: str) -> None:
        if mode not in SAMPLERS or mode == "auto":  # the daemon resolves auto
            raise ValueError(f"unknown sampler {mode!r}: one of {', '.join(SAMPLERS)}")
        self.runtime = runtime
        self.mode = mode
        self.device_k = runtime.params.device_top_k  # > 0: candidates come from the device
        self.full_row: set[int] = set()  # sequences whose requests need the whole row

    def new(self, seq_id: int, req: p.Generate, default_seed: int) -> AnySampler:
        params = sampling_params(req)
        if req.grammar is not None:  # the whole row, on the host
            if self.device_k:
                self.runtime.set_device_top_k(seq_id, False)
                self.full_row.add(seq_id)
            eog = self.runtime.eog_tokens
            return GrammarSampler(self.runtime.vocab, req.grammar, params, default_seed, eog)
        if self.mode in ("numpy", "backend-topk"):
            sampler = TokenSampler(params, default_seed)
            full = sampler.needs_full_row(self.device_k) or req.logprobs is not None
            if self.device_k and full:
                self.runtime.set_device_top_k(seq_id, False)
                self.full_row.add(seq_id)
            return sampler
        # logprobs need the row on the host: such a request's chain runs there
        on_device = self.mode == "backend" and req.logprobs is None
        return self.runtime.new_sampler(params, default_seed, seq_id if on_device else None)

    def release(self, seq_id: int, sampler: AnySampler | None) -> None:
        if sampler is not None:
            sampler.free()
        if seq_id in self.full_row:  # give the sequence its device top-k back
            self.full_row.discard(seq_id)
            self.runtime.set_device_top_k(seq_id, True)

    def sample_rows(
        self, rows: list[tuple[int, AnySampler | None, int, int | None]]
    ) -> list[tuple[int, p.Logprobs | None]]:
        """The tokens of a tick's rows, each (seq_id, sampler, row, logprobs k): the rows whose
        candidates come from the device are drawn together, the others one by one (a request
        with logprobs always has its whole row: see new)."""
        together = [i for i, row in enumerate(rows) if self._from_candidates(row[0], row[1])]
        picks: list[tuple[int, p.Logprobs | None] | None] = [None] * len(rows)
        if together:
            ids, logits = self.runtime.candidates([rows[i][2] for i in together])
            samplers = [rows[i][1] for i in together]
            tokens = sample_candidates_batch(samplers, ids, logits)  # type: ignore[arg-type]
            for i, token in zip(together, tokens, strict=True):
                picks[i] = (token, None)
        return [
            pick if pick is not None else self.sample_logprobs(*row)
            for pick, row in zip(picks, rows, strict=True)
        ]

    def _from_candidates(self, seq_id: int, sampler: AnySampler | None) -> bool:
        """Whether this row's token comes from the device's top-k candidates."""
        device = self.device_k > 0 and seq_id not in self.full_row
        return device and isinstance(sampler, TokenSampler)

    def sample_logprobs(
        self, seq_id: int, sampler: AnySampler | None, row: int, k: int | None
    ) -> tuple[int, p.Logprobs | None]:
        """The token, and with ``k`` set the model's log-probabilities at this step (from the
        row as the model wrote it: the chain may bias or penalise it in place)."""
        if k is None:
            return self.sample(seq_id, sampler, row), None
        raw = np.array(self.runtime.logits_row(row), dtype=np.float32)
        token = self.sample(seq_id, sampler, row)
        return token, logprobs_of(raw, token, k, self.runtime.piece)

    def sample(self, seq_id: int, sampler: AnySampler | None, row: int) -> int:
        """The session's next token from batch row ``row`` of the last decode."""
        if isinstance(sampler, GrammarSampler):
            return sampler.sample(self.runtime.logits_row(row))
        if isinstance(sampler, TokenSampler):
            if self._from_candidates(seq_id, sampler):
                ids, logits = self.runtime.candidates([row])
                return sampler.sample_candidates(ids[0], logits[0])
            return sampler.sample(self.runtime.logits_row(row))
        assert isinstance(sampler, Sampler)
        return self.runtime.sample(sampler, row)
