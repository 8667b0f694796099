"""Prompt-lookup speculation, the scheduler's side: a sequence's n-gram index at admission,
drafts for the decoding sequences before a tick, and a drafted decode's verified run taken
after it. The rules (when to draft, what to propose, how acceptance is smoothed) are
core/spec/drafts.py's; the scheduler calls these steps and owns the KV they leave."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from uma_serve.core import protocol as p
from uma_serve.core.engine.sequence import Sequence
from uma_serve.core.engine.tick import Sampled
from uma_serve.core.metrics import EngineMetrics
from uma_serve.core.spec.drafts import (
    WorkloadAcceptance,
    acceptance,
    drafting,
    proposal,
    smoothed,
)
from uma_serve.core.spec.ngram import NgramIndex

Emit = Callable[[int, p.Logprobs | None], bool]  # a token through the output step: still on?


class Speculation:
    def __init__(self, max_draft: int, max_streams: int, metrics: EngineMetrics) -> None:
        self.max_draft = max_draft  # drafted tokens a stream a tick at most (0: off)
        self.max_streams = max_streams
        self.metrics = metrics
        self._accept = WorkloadAcceptance()  # a new session's draft acceptance estimate

    @property
    def on(self) -> bool:
        return self.max_draft > 0

    def start(self, seq: Sequence) -> None:
        """An admitted sequence's n-gram index and acceptance estimate."""
        if self.on:
            seq.ngrams = NgramIndex(seq.prompt)
            seq.spec_accept_ewma = self._accept.value

    def propose(self, running: Iterable[Sequence], n_ctx: int) -> None:
        """Prompt-lookup drafts for the decoding sequences (core/spec/drafts.py)."""
        if not self.on:
            return
        decoding = [s for s in running if s.next_token is not None]
        few = drafting(len(decoding), self.max_streams)
        for s in decoding:
            left = s.request.max_tokens - s.generated
            s.draft = proposal(s.ngrams, self.max_draft, left, n_ctx - s.n_past) if few else ()

    def take(self, seq: Sequence, drafts: list[int], got: Sampled, emit: Emit) -> None:
        """A decode of [pending token, *drafts]: the executor drew its rows while they agreed
        with the drafts (row j follows drafts[:j]). Each drawn token takes the usual path
        (``emit``); while it equals its draft, that draft's KV is already at the next
        position. The first disagreement (or the row after the last draft) is the new pending
        token; the KV beyond ``seq.n_past`` is the scheduler's to trim."""
        seq.n_past += 1  # the pending token
        seq.next_token = None
        accepted = 0
        for j, token in enumerate(got.tokens):
            if not emit(token, got.logprobs[j]):
                break  # it ended (end of generation, a stop string, its length)
            if j == len(drafts) or token != drafts[j]:
                break
            seq.n_past += 1
            accepted += 1
            seq.next_token = None
        rate = acceptance(accepted, len(drafts))
        seq.spec_accept_ewma = smoothed(seq.spec_accept_ewma, rate)
        self._accept.observe(rate)
        self.metrics.spec_drafted_tokens_total += len(drafts)
        self.metrics.spec_accepted_tokens_total += accepted
