"""Speculative decoding by prompt lookup: drafts from the session's own tokens, no draft model.

The engine drafts from each session's n-gram index (core/spec/) and shows the proposal in
the SessionView (``draft``).

``SpeculativeDecode`` (the Plan transformer) decides whether and how much of it to verify:
only while at most ``spec_max_streams`` streams decode, and as many tokens as the session's
acceptance EWMA earns against what they cost every stream of the tick. A session whose
drafts are mostly rejected drafts only a probe now and then. A decode item of
``n_tokens = 1 + k`` carries the pending token plus k drafted tokens, all with logits; the
engine samples row by row and keeps the agreeing run (exact: core/spec/drafts.py).
"""

from __future__ import annotations

from msgspec.structs import replace

from uma_serve.core.policy.plan import Constraints, Phase, Plan, plan_shape
from uma_serve.core.policy.state import PlanTransformer, SchedulerState, views_by_seq

PROBE_EVERY = 8  # ticks between a lone stream's probes when its drafts do not pay
# with several streams, ticks between probes (one stream's at a time): under 1 tick in 20, so
# the longer probe ticks stay out of the streams' inter-token p95
PROBE_EVERY_SHARED = 32
PROBE_TOKENS = 2


def draft_length(
    p: float,
    max_draft: int,
    available: int,
    tick_ms: float,
    draft_ms: float,
    tokens: float = 1.0,
    probe: bool = False,
) -> int:
    """Tokens to verify: the k that maximises the tick's expected tokens per ms.

    The tick yields ``tokens`` (one per decoding stream, plus drafts already granted) in
    tick_ms. With per-token acceptance p (the session's EWMA), k drafted tokens add
    p + ... + p^k tokens and k x draft_ms (a drafted token costs like a decoding row: a token
    with its logits). A draft slows every stream of the tick, so the more streams share it,
    the better it must be accepted to pay. When no k > 0 pays, the session only probes (a
    short draft, when ``probe``) so its estimate can recover.
    """
    limit = min(available, max_draft)
    if limit <= 0:
        return 0
    best_k, best_rate = 0, tokens / max(tick_ms, 1e-3)
    gain, term = tokens, 1.0
    for k in range(1, limit + 1):
        term *= p
        gain += term
        rate = gain / max(tick_ms + k * draft_ms, 1e-3)
        if rate > best_rate:
            best_k, best_rate = k, rate
    if best_k == 0 and probe:
        return min(PROBE_TOKENS, limit)
    return best_k


def expected_tokens(p: float, k: int) -> float:
    """p + p^2 + ... + p^k: the tokens k drafts add on average."""
    return sum(p**j for j in range(1, k + 1))


class SpeculativeDecode(PlanTransformer):
    def apply(self, plan: Plan, state: SchedulerState, c: Constraints) -> Plan:
        if c.spec_max_draft <= 0 or plan.empty:
            return plan
        decoders = [i for i in plan.items if i.phase is Phase.DECODE]
        if not decoders or len(decoders) > c.spec_max_streams:
            return plan
        views = views_by_seq(state)
        room = c.n_batch - plan.n_tokens
        cost = state.stats.cost
        tick_ms = cost.predict(plan_shape(plan.items, views))
        tokens = float(len(decoders))  # what the tick yields before any draft
        # streams take turns to probe, so probing costs the same however many decode
        probe_period = PROBE_EVERY if len(decoders) == 1 else PROBE_EVERY_SHARED * len(decoders)
        items = []
        for item in plan.items:
            view = views[item.seq_id]
            if item.phase is Phase.DECODE and item.n_tokens == 1 and view.draft and room > 0:
                draft_ms = cost.b + cost.d * (view.n_past + 1) / 1000.0
                k = draft_length(
                    view.spec_accept_ewma,
                    c.spec_max_draft,
                    min(len(view.draft), room),
                    tick_ms,
                    draft_ms,
                    tokens,
                    (state.stats.tick + item.seq_id) % probe_period == 0,
                )
                if k > 0:
                    item = replace(item, n_tokens=1 + k)
                    room -= k
                    tokens += expected_tokens(view.spec_accept_ewma, k)
                    tick_ms += k * draft_ms
            items.append(item)
        return replace(plan, items=tuple(items))
