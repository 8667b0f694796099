"""What the engine learns from the ticks it runs, for the next plans.

After every tick: the online tick-time model (the one cost estimate), the engine's own per-tick
overhead (time between ticks outside llama_decode), and each listed plan transformer's own
state, stepped by its own ``observe`` (the guard's hysteresis, the QoS lanes' tuner) and shown
by its ``report``. The result is the immutable ``EngineStats`` the next SchedulerState
carries; the tick's statistics (its predicted time) go to the metrics only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from uma_serve.core.engine.tickmodel import OnlineTickModel
from uma_serve.core.metrics import EngineMetrics
from uma_serve.core.policy import (
    Constraints,
    EngineStats,
    Phase,
    Plan,
    PlanTransformer,
    SchedulerState,
    Tick,
    plan_shape,
)

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
    def __init__(
        self, constraints: Constraints, transformers: Sequence[PlanTransformer] = ()
    ) -> None:
        self.constraints = constraints
        self._transformers = list(transformers)
        self._model = OnlineTickModel(constraints.tick_prior)
        self.stats = EngineStats(
            self._model.cost, states=tuple(t.initial(constraints) for t in transformers)
        )
        # (start, decode ms, launch-to-device-done ms) of the last tick
        self._prev_tick: tuple[float, float, float] | None = None
        self._overhead_ms = 0.0

    def idle(self) -> None:
        """The engine waits for work: the time until the next tick is not overhead."""
        self._prev_tick = None

    def tick_started(self, t0: float, m: EngineMetrics) -> None:
        """Busy since the last tick: the rest was overhead, and the engine's host time (the
        part outside launch to device done, which a GPU waits through)."""
        if self._prev_tick is not None:
            prev_t0, prev_ms, prev_span_ms = self._prev_tick
            gap_ms = (t0 - prev_t0) * 1e3
            self._overhead_ms = ewma(self._overhead_ms, gap_ms - prev_ms)
            m.engine_busy_seconds_total += gap_ms / 1e3
            m.engine_host_seconds_total += max(gap_ms - prev_span_ms, 0.0) / 1e3

    def tick_decoded(self, t0: float, ms: float, overlap_ms: float = 0.0) -> None:
        self._prev_tick = (t0, ms, ms + overlap_ms)

    def record(self, ms: float, plan: Plan, state: SchedulerState, m: EngineMetrics) -> None:
        st = self.stats
        views = {v.seq_id: v for v in state.sessions}
        shape = plan_shape(plan.items, views)
        predicted = st.cost.predict(shape)  # what the plan was made with
        self._model.update(shape, ms)
        self._metrics(ms, plan, predicted, m)
        tick = Tick(ms, plan, state, self._model.cost, self.constraints)
        states = []
        for t in self._transformers:  # each steps its own state, shows it in the metrics
            own = t.observe(st.own(t.State), tick)
            t.report(own, tick, m)
            states.append(own)
        self.stats = EngineStats(self._model.cost, self._overhead_ms, st.tick + 1, tuple(states))
        if log.isEnabledFor(logging.DEBUG):
            self._log(ms, plan, predicted, views)

    def _metrics(self, ms: float, plan: Plan, predicted: float, m: EngineMetrics) -> None:
        """The tick's figures that no transformer owns."""
        n_decode = plan.n_decode
        n_draft = sum(i.n_tokens - 1 for i in plan.items if i.phase is Phase.DECODE)
        m.record_tick(ms, n_decode, plan.n_tokens - n_decode - n_draft)
        m.tick_ms_predicted_last = predicted
        m.tick_overhead_ms_ewma = self._overhead_ms
        m.tick_budget_ms_last = plan.budget_ms or 0.0
        m.prefill_guard_active = int(plan.guard_active)
        m.parked_sessions = len(plan.parked)

    def _log(self, ms: float, plan: Plan, predicted: float, views: dict) -> None:
        n_decode = plan.n_decode
        n_draft = sum(i.n_tokens - 1 for i in plan.items if i.phase is Phase.DECODE)
        log.debug(
            "tick %d at %.3f: decode %d prefill %d draft %d parked %d | %.2f ms (predicted "
            "%.1f, budget %s%s) | model a %.2f b %.3f c %.3f d %.4f e %.2f | items %s",
            self.stats.tick,
            time.monotonic() * 1e3,  # tick's end; CLOCK_MONOTONIC, as bench's perf_counter
            n_decode,
            plan.n_tokens - n_decode - n_draft,
            n_draft,
            len(plan.parked),
            ms,
            predicted,
            f"{plan.budget_ms:.1f}" if plan.budget_ms is not None else "-",
            "".join(f", {note}" for note in plan.notes),
            *(getattr(self._model.cost, k) for k in "abcde"),
            " ".join(items_text(plan, views)),
        )
