"""The executor: runs a Batch as one llama_decode and samples its rows.

It builds the batch's spans, opens the abort window for a tick of bulk work, decodes, runs the
scheduler's release of finished sequences while the device computes, and samples: plain rows
together, drafted decodes row by row while the drawn token agrees with the draft (speculative
verification; the scheduler keeps the agreeing run). A failed decode is undone in the cache
and classified; what follows from it is the scheduler's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from uma_serve.core import protocol as p
from uma_serve.core.engine.sequence import Sequence
from uma_serve.core.engine.tick import Batch, Failure, Sampled, TickResult
from uma_serve.core.policy import BatchItem, Phase
from uma_serve.core.runtime import Span
from uma_serve.core.runtime.api import RuntimeApi
from uma_serve.core.sampling import Row, Sampler

ABORTED = 2  # llama_decode's rc when Runtime.abort stopped it


class AbortWindow(Protocol):
    """The engine's inbox, as the executor sees it: a chat turn's arrival while the window is
    open aborts the decode."""

    def open_abort_window(self) -> None: ...
    def close_abort_window(self) -> None: ...


class Executor:
    def __init__(
        self,
        runtime: RuntimeApi,
        sampler: Sampler,
        inbox: AbortWindow,
    ) -> None:
        self.runtime = runtime
        self.sampler = sampler
        self._inbox = inbox

    def run(self, batch: Batch, meanwhile: Callable[[], float] = lambda: 0.0) -> TickResult:
        """Decode the batch; ``meanwhile`` runs while the device computes (on a GPU) and
        returns the seconds it took, which are not the tick's."""
        spans = [span(item, seq) for item, seq in zip(batch.plan.items, batch.seqs, strict=True)]
        t0 = time.perf_counter()
        if batch.abortable:
            self._inbox.open_abort_window()
        rc, rows = self.runtime.decode(spans)
        if batch.abortable:
            self._inbox.close_abort_window()
        freed_s = meanwhile()
        self.runtime.synchronize()  # the tick's time includes the device's work
        ms = (time.perf_counter() - t0 - freed_s) * 1e3
        if rc != 0:
            for s in spans:  # undo whatever part of the batch reached the cache
                self.runtime.seq_trim(s.seq_id, s.pos)
            return TickResult(rc, t0, ms, failure=classify(rc, freed=freed_s > 0))
        return TickResult(rc, t0, ms, sampled=self._sample(batch, spans, rows))

    def _sample(self, batch: Batch, spans: list[Span], rows: list[int]) -> tuple[Sampled, ...]:
        out = [Sampled()] * len(spans)
        plain: list[int] = []  # items with one row, sampled together
        drafted: list[int] = []  # rows verified one by one
        for i, (s, row) in enumerate(zip(spans, rows, strict=True)):
            if batch.plan.items[i].phase is Phase.DECODE and len(s.tokens) > 1:
                drafted.append(i)
            elif row >= 0:
                plain.append(i)
        picks = self.sampler.sample([row_of(batch.seqs[i], rows[i]) for i in plain])
        for i, (token, lp) in zip(plain, picks, strict=True):
            out[i] = Sampled((token,), (lp,))
        for i in drafted:
            out[i] = self._verify(batch.seqs[i], spans[i].tokens[1:], rows[i])
        return tuple(out)

    def _verify(self, seq: Sequence, drafts: list[int], row: int) -> Sampled:
        """Rows ``row + j`` of [pending token, *drafts]: row j holds the distribution after
        the pending token and drafts[:j], so it is valid only while the tokens drawn so far
        equal the drafts. Drawn with the session's own sampler, in order, up to the first
        disagreement or the row after the last draft."""
        tokens: list[int] = []
        lps: list[p.Logprobs | None] = []
        for j in range(len(drafts) + 1):
            [(token, lp)] = self.sampler.sample([row_of(seq, row + j)])
            tokens.append(token)
            lps.append(lp)
            if j == len(drafts) or token != drafts[j]:
                break
        return Sampled(tuple(tokens), tuple(lps))


def span(item: BatchItem, seq: Sequence) -> Span:
    """The tokens an item decodes: a decode's pending token and drafts, or a prompt chunk."""
    n = item.n_tokens
    if item.phase is Phase.DECODE:
        assert seq.next_token is not None
        tokens = [seq.next_token, *seq.draft[: n - 1]]
        return Span(seq.seq_id, seq.n_past, tokens, True, all_logits=len(tokens) > 1)
    last = item.logits and seq.n_past + n == len(seq.prompt)
    return Span(seq.seq_id, seq.n_past, seq.prompt[seq.n_past : seq.n_past + n], last)


def row_of(seq: Sequence, row: int) -> Row:
    assert seq.sampler is not None
    return Row(seq.sampler, row, seq.request.logprobs)


def classify(rc: int, freed: bool) -> Failure:
    if rc == ABORTED:
        return Failure.ABORTED
    if rc == 1:  # no KV slot; a retry fits when finished sequences' cells were freed after it
        return Failure.RETRY if freed else Failure.NO_SLOT
    return Failure.ERROR
