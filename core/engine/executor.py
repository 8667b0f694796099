"""The executor: runs a Batch as one llama_decode and samples its rows.

It reads only the Batch (spans, sampler rows) and calls nothing back. ``launch`` starts the
decode (on a GPU llama_decode returns once the graph is launched); the engine does host work
meanwhile; ``collect`` waits for the device and samples: plain rows together, drafted decodes
row by row while the drawn token agrees with the draft (speculative verification; the
scheduler keeps the agreeing run). A failed decode is undone in the cache and classified; what
follows from it is the scheduler's.
"""

from __future__ import annotations

import time

from uma_serve.core import protocol as p
from uma_serve.core.engine.tick import Batch, Draw, Failure, Launched, Sampled, TickResult
from uma_serve.core.runtime.api import RuntimeApi
from uma_serve.core.sampling import Row, Sampler

ABORTED = 2  # llama_decode's rc when Runtime.abort stopped it


class Executor:
    def __init__(self, runtime: RuntimeApi, sampler: Sampler) -> None:
        self.runtime = runtime
        self.sampler = sampler
        self._graph_reuses = runtime.graph_reuses()  # its count at the last collected tick

    def launch(self, batch: Batch, on_thread: bool = False) -> Launched:
        """Start the batch's llama_decode (a CPU computes it here, a GPU after it returns;
        ``on_thread``: on the runtime's launch thread, while this one works for others)."""
        t0 = time.perf_counter()
        rows = self.runtime.launch(list(batch.spans), on_thread)
        return Launched(batch, tuple(rows), t0)

    def collect(self, launched: Launched, overlap_s: float, freed: bool) -> TickResult:
        """Wait for the device, then sample. ``overlap_s``: the host work done since the
        launch, which is not the tick's; ``freed``: it freed finished sequences' KV (a decode
        that found no slot is then retried)."""
        batch, t0 = launched.batch, launched.t0
        # llama_decode counted its graph's reuse before it returned: read while the device
        # computes, not between the device's end and the next launch (13 us on an H100 host)
        reuses, self._graph_reuses = self._graph_reuses, self.runtime.graph_reuses()
        rc = self.runtime.synchronize()  # the tick's time includes the device's work
        t1 = time.perf_counter()
        ms = (t1 - t0 - overlap_s) * 1e3
        overlap_ms = overlap_s * 1e3
        if rc != 0:
            for s in batch.spans:  # undo whatever part of the batch reached the cache
                self.runtime.seq_trim(s.seq_id, s.pos)
            return TickResult(rc, t0, ms, classify(rc, freed), overlap_ms=overlap_ms)
        sampled = self._sample(batch, launched.rows)
        sample_ms = (time.perf_counter() - t1) * 1e3
        reused = self._graph_reuses > reuses
        return TickResult(rc, t0, ms, None, sampled, sample_ms, overlap_ms, reused)

    def _sample(self, batch: Batch, rows: tuple[int, ...]) -> tuple[Sampled, ...]:
        out = [Sampled()] * len(batch.spans)
        plain: list[int] = []  # items with one row, sampled together
        for i, (draw, row) in enumerate(zip(batch.draws, rows, strict=True)):
            if draw is None or row < 0:
                continue
            if draw.drafts:
                out[i] = self._verify(draw, row)
            else:
                plain.append(i)
        picks = self.sampler.sample([row_of(batch.draws[i], rows[i]) for i in plain])
        for i, (token, lp) in zip(plain, picks, strict=True):
            out[i] = Sampled((token,), (lp,))
        return tuple(out)

    def _verify(self, draw: Draw, row: int) -> Sampled:
        """Rows ``row + j`` of [pending token, *drafts]: row j holds the distribution after
        the pending token and drafts[:j], so it is valid only while the tokens drawn so far
        equal the drafts. Drawn with the session's own sampler, in order, up to the first
        disagreement or the row after the last draft."""
        drafts = draw.drafts
        tokens: list[int] = []
        lps: list[p.Logprobs | None] = []
        for j in range(len(drafts) + 1):
            [(token, lp)] = self.sampler.sample([row_of(draw, row + j)])
            tokens.append(token)
            lps.append(lp)
            if j == len(drafts) or token != drafts[j]:
                break
        return Sampled(tuple(tokens), tuple(lps))


def row_of(draw: Draw | None, row: int) -> Row:
    assert draw is not None
    return Row(draw.sampler, row, draw.logprobs)


def classify(rc: int, freed: bool) -> Failure:
    if rc == ABORTED:
        return Failure.ABORTED
    if rc == 1:  # no KV slot; a retry fits when finished sequences' cells were freed after it
        return Failure.RETRY if freed else Failure.NO_SLOT
    return Failure.ERROR
