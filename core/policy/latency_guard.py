"""LatencyGuard: keep protected work's ticks within a time budget (policy/work.py says
which work is protected: every stream's decode tokens and chat turns' prompts).

A tick that carries protected work is budgeted at ``slo_tbt_ms`` if set, else at the predicted
period of that work alone stretched by (1 + headroom), where a period is the decode time plus
the engine's per-tick overhead (what a client sees between two tokens). Bulk work (long
prompts, labeled background streams) joins only as far as the tick-time model predicts it
fits. A chat turn's prompt is prefilled in chunks of at most ``slo_ttft_ms`` per tick while
other streams decode. Ticks of bulk work only are bounded by ``bg_tick_ms`` while a
conversation is recent, and by the batch alone once none has been for ``quiet_ms`` (big
chunks prefill up to ~40% faster on a CPU); the engine cuts such a tick short when a chat turn
arrives (on a CPU; a GPU finishes its tick).

Hysteresis: after a tick that overran its budget the engine sets ``guard_hold`` (no bulk
prefill for H ticks) then ``guard_ramp`` (a prefill cap that doubles each tick). Nothing
starves: a session not advanced for ``starve_ms`` gets one token even over budget.

Stepped cost (a GPU): when any prefill makes a tick a step slower (the model's ``e``, worth
more than ``min_prefill_tokens`` prompt tokens) and that step alone breaks the budget, small
chunks would stretch every gap for little progress. Instead one protected tick in
``pause_every`` is a *pause*: it carries a step's worth of bulk prompt (``e / c`` tokens, ~240
on an H100), so the stretched gap pays the step twice and no more, and the engine holds bulk
prefill for the next ``pause_every`` x (1 + r) ticks, where r is the measured number of slow
ticks that follow a pause (a GPU re-captures its decode graph after a prefill tick). One gap
in ``pause_every`` (default 100: 1%) is stretched, so a stream's ITL p95 stays at solo. A
prompt that waited ``starve_ms`` gets a pause at once, not a one-token chunk.
"""

from __future__ import annotations

from dataclasses import replace

from uma_serve.core.policy.state import (
    BatchItem,
    Constraints,
    Phase,
    Plan,
    SchedulerState,
    item_shape,
    views_by_seq,
)
from uma_serve.core.policy.tickmodel import TickShape
from uma_serve.core.policy.work import INTERACTIVE

STARVED_CHUNK = 1  # tokens a starved session gets in a tick over budget
UNLIMITED = 1 << 30


class LatencyGuard:
    def apply(self, plan: Plan, state: SchedulerState, c: Constraints) -> Plan:
        if plan.empty:
            return plan
        views = views_by_seq(state)
        stats, cost = state.stats, state.stats.cost
        kept: list[BatchItem] = []
        shape = TickShape(0, 0, 0.0)  # of kept, kept up to date as items join

        def keep(item: BatchItem) -> None:
            nonlocal shape
            kept.append(item)
            shape = shape + item_shape(item, views[item.seq_id])

        def room(budget: float) -> int:
            return cost.prefill_that_fits(shape.decode, shape.kv_k, budget) - shape.prefill

        def starved(item: BatchItem) -> bool:
            return state.now_ns - views[item.seq_id].last_progress_ns > c.starve_ms * 1e6

        protected_items = {i.seq_id for i in plan.items if views[i.seq_id].qos == INTERACTIVE}
        bulk = [i for i in plan.items if i.seq_id not in protected_items]
        for item in plan.items:
            if item.phase is Phase.DECODE and item.seq_id in protected_items:
                keep(item)
        # chat turns' prompts: in chunks that fit the stretch while other streams decode; as
        # fast as the base plan allows when none does
        decoding = bool(kept)
        stretch = c.slo_ttft_ms or c.bg_tick_ms
        for item in plan.items:
            if item.phase is Phase.PREFILL and item.seq_id in protected_items:
                n = min(item.n_tokens, max(room(stretch) if decoding else item.n_tokens, 1))
                keep(replace(item, n_tokens=n, logits=n == views[item.seq_id].pending_prefill))
        protected = bool(kept)
        if protected:
            solo = cost.predict(shape) + stats.overhead_ms_ewma
            budget = c.slo_tbt_ms or solo * (1.0 + c.headroom)
            budget -= stats.overhead_ms_ewma  # compare with predicted decode time
        elif c.quiet_ms and state.now_ns - state.last_interactive_ns > c.quiet_ms * 1e6:
            budget = UNLIMITED  # abortable: no conversation is going on
        else:
            budget = c.bg_tick_ms
        if not bulk:
            return replace(
                plan, items=tuple(kept), budget_ms=budget, predicted_ms=cost.predict(shape)
            )
        held = protected and stats.guard_hold > 0
        prefill_cap = stats.guard_ramp if stats.guard_ramp is not None else UNLIMITED
        bulk_prefill = [i for i in bulk if i.phase is Phase.PREFILL]
        # a starved prompt's forced progress comes as a pause too: a one-token chunk would pay
        # the whole step (and the slow ticks after it) for one token
        pause = (
            protected
            and bool(bulk_prefill)
            and cost.stepped(c.min_prefill_tokens)
            and (not held or any(starved(i) for i in bulk_prefill))
            and room(budget) < c.min_prefill_tokens
        )
        if pause:  # the stretched gap: the protected work, the step and a step's worth of tokens
            budget = min(c.bg_tick_ms, cost.predict(shape) + 2 * cost.e)
            prefill_cap, held = UNLIMITED, False
        parked: list[int] = []
        for item in bulk:  # in the plan's order, while it fits
            if item.phase is Phase.DECODE:
                fits = cost.predict(shape + item_shape(item, views[item.seq_id])) <= budget
                if fits or starved(item):
                    keep(item)
                else:
                    parked.append(item.seq_id)
                continue
            # unprotected ticks always carry a minimum chunk: a mis-predicting model (a slow
            # moment of the machine) must not stall bulk prompts
            floor = 0 if protected else c.min_prefill_tokens
            n = 0 if held else min(item.n_tokens, max(room(budget), floor, 0), prefill_cap)
            if n <= 0 and starved(item):
                n = min(item.n_tokens, STARVED_CHUNK)
            if n > 0:
                keep(replace(item, n_tokens=n, logits=n == views[item.seq_id].pending_prefill))
        trimmed = sum(i.n_tokens for i in kept) < plan.n_tokens
        return replace(
            plan,
            items=tuple(kept),
            parked=plan.parked + tuple(parked),
            budget_ms=budget,
            predicted_ms=cost.predict(shape),
            guard_active=plan.guard_active or trimmed or held,
            pause=pause,
        )
