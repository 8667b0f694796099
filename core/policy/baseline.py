"""BaselinePolicy: decode first, then TTFT-first budgeted prefill with a per-session burst.

The prefill budget adapts to the tick time budget through the tick-time model.
"""

from __future__ import annotations

import math

from uma_serve.core.policy.plan import BatchItem, Constraints, Phase, Plan, SessionView
from uma_serve.core.policy.state import SchedulerState


def prefill_budget(state: SchedulerState, c: Constraints, n_decode: int) -> int:
    """Prefill tokens this tick may carry.

    With sessions decoding, what the tick-time model says fits the tick time budget after their
    decode (never less than a small chunk, so prompts always progress; nothing is held back
    before the model has seen a tick). With none decoding nobody waits on a token: the whole
    batch.
    """
    cost = state.stats.cost
    room = c.n_batch - n_decode
    if n_decode and cost.samples > 0 and math.isfinite(c.tick_budget_ms):
        fits = cost.prefill_that_fits(n_decode, 0.0, c.tick_budget_ms)
        room = min(room, max(fits, c.min_prefill_tokens))
    if c.max_prefill_tokens is not None:
        room = min(room, c.max_prefill_tokens)
    return max(room, 0)


def prefill_allotments(
    prefilling: list[SessionView], budget: int, burst: int
) -> list[tuple[SessionView, int]]:
    """Share ``budget`` prefill tokens: shortest remaining prompt first (fastest first token),
    at most ``burst`` per session per round, rounds until the budget or the work runs out."""
    order = sorted(prefilling, key=lambda s: (s.pending_prefill, s.arrival_ns))
    given = dict.fromkeys((s.seq_id for s in order), 0)
    while budget > 0:
        progressed = False
        for s in order:
            room = s.pending_prefill - given[s.seq_id]
            n = min(room, burst, budget)
            if n > 0:
                given[s.seq_id] += n
                budget -= n
                progressed = True
        if not progressed:
            break
    return [(s, given[s.seq_id]) for s in order if given[s.seq_id] > 0]


class BaselinePolicy:
    def schedule_tick(self, state: SchedulerState, constraints: Constraints) -> Plan:
        decoders = [s for s in state.sessions if s.phase is Phase.DECODE]
        prefilling = [s for s in state.sessions if s.phase is Phase.PREFILL]
        decoders = decoders[: constraints.n_batch]
        items = [BatchItem(s.seq_id, Phase.DECODE, 1, True) for s in decoders]
        room = prefill_budget(state, constraints, len(decoders))
        for s, n in prefill_allotments(prefilling, room, constraints.prefill_burst):
            items.append(BatchItem(s.seq_id, Phase.PREFILL, n, n == s.pending_prefill))
        return Plan(items=tuple(items))
