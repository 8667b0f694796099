"""What the engine learns from the ticks it runs, for the next plans.

After every tick: the online tick-time model (the one cost estimate), the engine's own per-tick
overhead (time between ticks outside llama_decode), the LatencyGuard's hysteresis (its own
``observe`` step) and the sweet-spot tuner's observation. The result is the immutable
``EngineStats`` the next SchedulerState carries; the tick's statistics (its predicted time, its
estimated bytes) go to the metrics only.
"""

from __future__ import annotations

import logging
import time

from uma_serve.core.engine.tickmodel import OnlineTickModel
from uma_serve.core.engine.tuner import SweetSpotTuner
from uma_serve.core.metrics import EngineMetrics
from uma_serve.core.policy import (
    Constraints,
    EngineStats,
    Phase,
    Plan,
    SchedulerState,
    latency_guard as guard,
    plan_shape,
)
from uma_serve.core.policy.bmt import tick_bytes

EWMA_ALPHA = 0.2
log = logging.getLogger("uma.engine")  # the engine's tick log (debug level)


def items_text(plan: Plan, views: dict) -> list[str]:
    """A plan's items for the tick log: QoS initial, sequence, phase initial, tokens (i3D1)."""
    return [
        f"{views[i.seq_id].qos[0]}{i.seq_id}{i.phase.value[0].upper()}{i.n_tokens}"
        for i in plan.items
    ]


def ewma(old: float, new: float) -> float:
    return new if old <= 0 else EWMA_ALPHA * new + (1 - EWMA_ALPHA) * old


class TickLearner:
    def __init__(self, constraints: Constraints, tuner: SweetSpotTuner | None) -> None:
        self.constraints = constraints
        self.stats = EngineStats()
        self._model = OnlineTickModel()
        self._tuner = tuner
        self._prev_tick: tuple[float, float] | None = None  # (start, decode ms) of the last tick
        self._overhead_ms = 0.0

    def idle(self) -> None:
        """The engine waits for work: the time until the next tick is not overhead."""
        self._prev_tick = None

    def tick_started(self, t0: float) -> None:
        if self._prev_tick is not None:  # busy since the last tick: the rest was overhead
            prev_t0, prev_ms = self._prev_tick
            self._overhead_ms = ewma(self._overhead_ms, (t0 - prev_t0) * 1e3 - prev_ms)

    def tick_decoded(self, t0: float, ms: float) -> None:
        self._prev_tick = (t0, ms)

    def record(self, ms: float, plan: Plan, state: SchedulerState, m: EngineMetrics) -> None:
        n_decode = plan.n_decode
        n_prefill = plan.n_tokens - n_decode  # drafted tokens cost like prompt tokens
        n_draft = sum(i.n_tokens - 1 for i in plan.items if i.phase is Phase.DECODE)
        st = self.stats
        views = {v.seq_id: v for v in state.sessions}
        shape = plan_shape(plan.items, views)
        predicted = st.cost.predict(shape)  # what the plan was made with
        self._model.update(shape, ms)
        g = guard.observe(st.guard, ms, plan, views, self._model.cost, self.constraints)
        if self._tuner is not None:
            self._tuner.observe(plan.n_tokens, ms, contended=bool(plan.parked))
        self.stats = EngineStats(
            cost=self._model.cost,
            overhead_ms_ewma=self._overhead_ms,
            tick=st.tick + 1,
            guard=g,
            bg_decoders_cap=self._tuner.s if self._tuner else st.bg_decoders_cap,
            bg_burst=self._tuner.k if self._tuner else st.bg_burst,
        )
        m.record_tick(ms, n_decode, n_prefill - n_draft)
        m.ticks_paused_total += plan.pause
        m.ticks_over_budget_total += g.overran
        m.tick_ms_predicted_last = predicted
        m.tick_overhead_ms_ewma = self._overhead_ms
        m.tick_budget_ms_last = plan.budget_ms or 0.0
        m.prefill_guard_active = int(plan.guard_active or g.hold > 0)
        m.parked_sessions = len(plan.parked)
        c = self.constraints
        m.bmt_estimate_last = tick_bytes(plan.items, views, c.model) if c.bmt_budget_gbs else 0.0
        m.bg_decoders_cap = self.stats.bg_decoders_cap if self._tuner else 0
        m.bg_burst = self.stats.bg_burst
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "tick %d at %.3f: decode %d prefill %d draft %d parked %d | %.2f ms (predicted "
                "%.1f, budget %s%s) | model a %.2f b %.3f c %.3f d %.4f e %.2f | items %s",
                self.stats.tick,
                time.monotonic() * 1e3,  # tick's end; CLOCK_MONOTONIC, as bench's perf_counter
                n_decode,
                n_prefill - n_draft,
                n_draft,
                len(plan.parked),
                ms,
                predicted,
                f"{plan.budget_ms:.1f}" if plan.budget_ms is not None else "-",
                ", pause" if plan.pause else "",
                *(getattr(self._model.cost, k) for k in "abcde"),
                " ".join(items_text(plan, views)),
            )
