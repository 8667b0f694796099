"""Prompt-lookup speculation on the engine's side: what to propose before a tick, and what a
verification says about the drafts after it.

The policy (core/policy/spec.py) decides how many drafted tokens each stream's decode item
carries; the proposals come from each sequence's own n-gram index, and once the tick has
logits on every drafted row the executor draws them with the session's own sampler while
they agree with the drafts (core/engine/executor.py). The scheduler keeps the agreeing run
and feeds the acceptance back here; nothing here changes a sequence.
"""

from __future__ import annotations

from uma_serve.core.spec.ngram import NgramIndex


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


def drafting(n_decoding: int, max_streams: int) -> bool:
    """Whether to propose drafts this tick: only while few streams decode (a draft slows every
    stream of the tick)."""
    return n_decoding <= max_streams


def proposal(
    ngrams: NgramIndex | None, max_draft: int, tokens_left: int, cells_left: int
) -> tuple[int, ...]:
    """One decoding stream's prompt-lookup draft: what followed the last occurrence of its
    latest tokens, within its ``max_tokens`` (``tokens_left`` to generate) and its context
    (``cells_left`` positions)."""
    if ngrams is None:
        return ()
    return ngrams.draft(min(max_draft, tokens_left - 1, cells_left - 2))


def acceptance(accepted: int, n_drafts: int) -> float:
    """One verification's per-token acceptance: the accepted drafts over those and the one
    rejection (if any). Every emitted token is the one plain decoding would sample from the
    same logits: greedy output is identical, sampled output has the same law."""
    return accepted / (accepted + (accepted < n_drafts))


def smoothed(ewma: float, rate: float) -> float:
    """A session's acceptance estimate after a verification (what SpeculativeDecode reads)."""
    return 0.3 * rate + 0.7 * ewma
