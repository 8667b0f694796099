"""Prompt-lookup speculation on the executor's side: drafts before a tick, verification after.

The policy (core/policy/spec.py) decides how many drafted tokens each stream's decode item
carries; here the drafts are proposed from each sequence's own n-gram index and, once the tick
has logits on every drafted row, accepted while they agree with what the session's sampler
drew (core/engine/executor.py samples the rows).
"""

from __future__ import annotations

from collections.abc import Callable

from uma_serve.core.engine.sequence import Sequence


class WorkloadAcceptance:
    """Draft acceptance over every session, smoothed: where a new session's estimate starts.

    A workload whose drafts are rejected (sampled prose) then does not pay an optimistic start
    for each request, and one whose drafts agree (greedy rewrites, agents) drafts from its
    first decoding tick.
    """

    def __init__(self, start: float = 0.7) -> None:
        self.value = start

    def observe(self, rate: float) -> None:
        self.value = 0.1 * rate + 0.9 * self.value


def propose_drafts(
    decoding: list[Sequence], max_draft: int, max_streams: int, n_ctx_per_seq: int
) -> None:
    """Prompt-lookup proposals for the decoding sequences (only while few decode)."""
    few = len(decoding) <= max_streams
    for s in decoding:
        s.draft = ()
        if few and s.ngrams is not None:
            limit = min(
                max_draft,
                s.request.max_tokens - s.generated - 1,
                n_ctx_per_seq - s.n_past - 2,
            )
            s.draft = s.ngrams.draft(limit)


def accept(
    seq: Sequence,
    drafts: list[int],
    n_sampled: int,
    emit: Callable[[int], None],
    workload: WorkloadAcceptance | None = None,
) -> int:
    """Speculative verification of [pending token, *drafts] decoded with logits on every row;
    returns how many drafts were accepted.

    Row j holds the distribution after the pending token and drafts[:j]; the executor drew
    ``n_sampled`` rows with the session's own sampler, in order, while the token equalled
    drafts[j]. ``emit(j)`` hands the token of row j to the usual path; while it equals
    drafts[j], that token is already in the KV at the next position. The first disagreement
    (or the row after the last draft) yields the new pending token; the caller removes the KV
    beyond the accepted run. Every emitted token is the one plain decoding would sample from
    the same logits: greedy output is identical, sampled output has the same law.
    """
    seq.n_past += 1  # the pending token
    seq.next_token = None
    accepted = 0
    for j in range(n_sampled):
        emit(j)
        if seq.next_token is None:  # finished (EOS, stop string, length)
            break
        if j == len(drafts) or seq.next_token != drafts[j]:
            break
        seq.n_past += 1
        accepted += 1
        seq.next_token = None
    # per-token acceptance: accepted tokens over accepted + the one rejection (if any)
    rate = accepted / (accepted + (accepted < len(drafts)))
    seq.spec_accept_ewma = 0.3 * rate + 0.7 * seq.spec_accept_ewma
    if workload is not None:
        workload.observe(rate)
    return accepted
