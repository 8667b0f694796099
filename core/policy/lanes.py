"""QoS decode lanes: interactive decoders always served; background decoders capped at S
per tick and rotated fairly (least recently served first, keeping a turn for k ticks);
interactive prefill ahead of background prefill."""

from __future__ import annotations

from dataclasses import replace

from uma_serve.core.policy.plan import Constraints, Phase, Plan, SessionView, views_by_seq
from uma_serve.core.policy.state import SchedulerState
from uma_serve.core.policy.work import INTERACTIVE


def background_turn_order(decoders: list[SessionView], burst: int) -> list[SessionView]:
    """Decoders mid-turn (served fewer than k ticks in a row) first, then the longest unserved."""
    return sorted(
        decoders,
        key=lambda s: (not (0 < s.burst < burst), s.last_progress_ns, s.seq_id),
    )


class QosLanes:
    def apply(self, plan: Plan, state: SchedulerState, c: Constraints) -> Plan:
        views = views_by_seq(state)
        cap = state.stats.bg_decoders_cap
        decode = [i for i in plan.items if i.phase is Phase.DECODE]
        prefill = [i for i in plan.items if i.phase is Phase.PREFILL]
        fg = [i for i in decode if views[i.seq_id].qos == INTERACTIVE]
        bg_views = [views[i.seq_id] for i in decode if views[i.seq_id].qos != INTERACTIVE]
        order = background_turn_order(bg_views, state.stats.bg_burst)
        served = {s.seq_id for s in order[:cap]}
        bg = [i for i in decode if i.seq_id in served]
        parked = tuple(s.seq_id for s in order[cap:])
        prefill.sort(key=lambda i: views[i.seq_id].qos != INTERACTIVE)  # stable: SRPT kept
        return replace(plan, items=tuple(fg + bg + prefill), parked=plan.parked + parked)
