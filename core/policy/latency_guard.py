"""LatencyGuard: keep ticks within a time budget while an interactive stream decodes.

Budget: ``slo_tbt_ms`` if set, else (1 + headroom) x the predicted tick of the interactive
decoders alone, so interactive inter-token gaps stay within that factor of running alone.
Background decoders and prefill are admitted only as far as the tick-time model predicts they
fit. When no interactive stream decodes, ticks are bounded by ``bg_tick_ms`` so a newly
arriving interactive request waits at most about that long for its first tick. A new
interactive prompt's prefill may stretch a tick to ``slo_ttft_ms`` (default ``bg_tick_ms``).

Hysteresis: after a tick that overran its budget the engine sets ``guard_hold`` (no background
prefill for H ticks) then ``guard_ramp`` (a prefill cap that doubles each tick). Nothing
starves: a session not advanced for ``starve_ms`` gets one token (decode) or a minimum chunk
(prefill) even over budget.
"""

from __future__ import annotations

from dataclasses import replace

from uma_serve.core.policy.qos import INTERACTIVE
from uma_serve.core.policy.state import (
    BatchItem,
    Constraints,
    Phase,
    Plan,
    SchedulerState,
    plan_shape,
    views_by_seq,
)

STARVED_CHUNK = 4  # prompt tokens a starved session gets per tick


class LatencyGuard:
    def apply(self, plan: Plan, state: SchedulerState, c: Constraints) -> Plan:
        if plan.empty:
            return plan
        views = views_by_seq(state)
        stats, cost = state.stats, state.stats.cost

        def interactive(item: BatchItem) -> bool:
            return views[item.seq_id].qos == INTERACTIVE

        def starved(item: BatchItem) -> bool:
            return state.now_ns - views[item.seq_id].last_progress_ns > c.starve_ms * 1e6

        fg_decode = [i for i in plan.items if i.phase is Phase.DECODE and interactive(i)]
        if fg_decode:
            solo = cost.predict(plan_shape(tuple(fg_decode), views))
            budget = c.slo_tbt_ms or solo * (1.0 + c.headroom)
        else:
            budget = c.bg_tick_ms
        kept: list[BatchItem] = list(fg_decode)
        parked: list[int] = []
        held = bool(fg_decode) and stats.guard_hold > 0
        prefill_cap = stats.guard_ramp if stats.guard_ramp is not None else 1 << 30
        for item in plan.items:
            if item in fg_decode:
                continue
            bg = not interactive(item)
            if item.phase is Phase.DECODE:
                fits = cost.predict(plan_shape((*kept, item), views)) <= budget
                if fits or starved(item):
                    kept.append(item)
                else:
                    parked.append(item.seq_id)
                continue
            if held and bg and not starved(item):
                continue
            # a new interactive prompt may stretch the tick, up to slo_ttft_ms or bg_tick_ms
            item_budget = budget if bg else max(budget, c.slo_ttft_ms or c.bg_tick_ms)
            shape = plan_shape(tuple(kept), views)
            room = cost.prefill_that_fits(shape.decode, shape.kv_k, item_budget) - shape.prefill
            n = min(item.n_tokens, max(room, 0), prefill_cap if bg else 1 << 30)
            if n <= 0 and starved(item):
                n = min(item.n_tokens, STARVED_CHUNK)
            if n > 0:
                pending = views[item.seq_id].pending_prefill
                kept.append(replace(item, n_tokens=n, logits=n == pending))
        trimmed = sum(i.n_tokens for i in kept) < plan.n_tokens
        return replace(
            plan,
            items=tuple(kept),
            parked=plan.parked + tuple(parked),
            budget_ms=budget,
            predicted_ms=cost.predict(plan_shape(tuple(kept), views)),
            guard_active=plan.guard_active or trimmed or held,
        )
