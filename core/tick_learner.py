"""What the engine learns from the ticks it runs, for the next plans.

After every tick: the smoothed tick costs, the online tick-time model, the engine's own
per-tick overhead (time between ticks outside llama_decode), the LatencyGuard's hysteresis
state and the sweet-spot tuner's observation. The result is the immutable ``EngineStats`` the
next SchedulerState carries; the matching figures go to the metrics.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from uma_serve.core.metrics import EngineMetrics
from uma_serve.core.policy import (
    Constraints,
    EngineStats,
    Phase,
    Plan,
    SchedulerState,
    plan_shape,
)
from uma_serve.core.policy.tickmodel import OnlineTickModel
from uma_serve.core.policy.tuner import SweetSpotTuner

EWMA_ALPHA = 0.2
MAX_RECOVERY_TICKS = 4  # slow ticks after a pause counted at most
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
        # interactive ticks over budget right after a pause (a GPU re-captures its decode
        # graph after a prefill tick): counted while it lasts, then smoothed
        self._recovering: int | None = None
        self._recovery_ticks = 2.0  # as measured on an H100 (CUDA graph re-capture)

    def idle(self) -> None:
        """The engine waits for work: the time until the next tick is not overhead."""
        self._prev_tick = None

    def tick_started(self, t0: float) -> None:
        if self._prev_tick is not None:  # busy since the last tick: the rest was overhead
            prev_t0, prev_ms = self._prev_tick
            self._overhead_ms = ewma(self._overhead_ms, (t0 - prev_t0) * 1e3 - prev_ms)

    def tick_decoded(self, t0: float, ms: float) -> None:
        self._prev_tick = (t0, ms)

    def decode_failed(self) -> None:
        self.stats = replace(self.stats, last_decode_failed=True)

    def record(self, ms: float, plan: Plan, state: SchedulerState, m: EngineMetrics) -> None:
        n_decode = plan.n_decode
        n_prefill = plan.n_tokens - n_decode  # drafted tokens cost like prompt tokens
        n_draft = sum(i.n_tokens - 1 for i in plan.items if i.phase is Phase.DECODE)
        st = self.stats
        base, per_tok = st.base_tick_ms_ewma, st.prefill_ms_per_token_ewma
        if n_prefill == 0:
            base = ewma(base, ms)
        elif n_prefill >= 8:
            per_tok = ewma(per_tok, max(ms - (base if n_decode else 0.0), 0.0) / n_prefill)
        views = {v.seq_id: v for v in state.sessions}
        self._model.update(plan_shape(plan.items, views), ms)
        hold, ramp = self._next_guard_state(ms, plan, views, m)
        if self._tuner is not None:
            self._tuner.observe(plan.n_tokens, ms, contended=bool(plan.parked))
        self.stats = EngineStats(
            decode_ms_ewma=ewma(st.decode_ms_ewma, ms),
            base_tick_ms_ewma=base,
            prefill_ms_per_token_ewma=per_tok,
            last_tick_tokens=plan.n_tokens,
            last_decode_failed=False,
            cost=self._model.cost,
            overhead_ms_ewma=self._overhead_ms,
            tick=st.tick + 1,
            guard_hold=hold,
            guard_ramp=ramp,
            bg_decoders_cap=self._tuner.s if self._tuner else st.bg_decoders_cap,
            bg_burst=self._tuner.k if self._tuner else st.bg_burst,
        )
        m.record_tick(ms, n_decode, n_prefill - n_draft)
        m.tick_ms_predicted_last = plan.predicted_ms or 0.0
        m.tick_overhead_ms_ewma = self._overhead_ms
        m.tick_budget_ms_last = plan.budget_ms or 0.0
        m.prefill_guard_active = int(plan.guard_active or hold > 0)
        m.parked_sessions = len(plan.parked)
        m.bmt_estimate_last = plan.bmt_estimate or 0.0
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
                plan.predicted_ms or 0.0,
                f"{plan.budget_ms:.1f}" if plan.budget_ms is not None else "-",
                ", pause" if plan.pause else "",
                *(getattr(self._model.cost, k) for k in "abcde"),
                " ".join(items_text(plan, views)),
            )

    def _bulk_caused(self, ms: float, plan: Plan, views: dict) -> bool:
        """Whether the bulk work's predicted share made the tick overrun: without it the
        tick would have kept its budget. An overrun that the protected work alone explains is
        the machine's noise (another process, a frequency drop); holding bulk prefill for it
        would starve long prompts on a busy machine, a few tokens every hold_ticks ticks."""
        cost = self._model.cost
        protected = tuple(i for i in plan.items if views[i.seq_id].qos == "interactive")
        bulk_ms = cost.predict(plan_shape(plan.items, views)) - cost.predict(
            plan_shape(protected, views)
        )
        return ms - bulk_ms <= (plan.budget_ms or 0.0)

    def _next_guard_state(
        self, ms: float, plan: Plan, views: dict, m: EngineMetrics
    ) -> tuple[int, int | None]:
        """Hysteresis: an overrun tick that carried background work holds background prefill
        for hold_ticks, then re-enables it with a cap that doubles each tick. A pause tick
        (stepped cost) holds it long enough that pauses, with the slow ticks that follow
        them, stretch one protected gap in pause_every; so does a chat turn's prompt tick,
        so that the new stream's first gaps are no pauses (they are its TTF5)."""
        st, c = self.stats, self.constraints
        background_work = any(
            i.phase is Phase.PREFILL or views[i.seq_id].qos != "interactive" for i in plan.items
        )
        over = plan.budget_ms is not None and ms > plan.budget_ms
        if plan.pause:  # background got its chunk: the next pause comes later
            m.ticks_paused_total += 1
            self._recovering = 0
            return round(c.pause_every * (1.0 + self._recovery_ticks)), None
        chat_turn = any(
            i.phase is Phase.PREFILL and views[i.seq_id].qos == "interactive" for i in plan.items
        )
        if chat_turn and self._model.cost.stepped(c.min_prefill_tokens):
            return max(st.guard_hold, round(c.pause_every * (1.0 + self._recovery_ticks))), None
        if self._recovering is not None and any(
            views[i.seq_id].qos == "interactive" for i in plan.items
        ):
            if over and self._recovering < MAX_RECOVERY_TICKS:
                self._recovering += 1
            else:
                self._recovery_ticks = 0.5 * (self._recovery_ticks + self._recovering)
                self._recovering = None
        if over and background_work and self._bulk_caused(ms, plan, views):
            m.ticks_over_budget_total += 1
            return max(c.hold_ticks, st.guard_hold - 1), None
        if st.guard_hold > 0:
            return st.guard_hold - 1, (1 if st.guard_hold == 1 else None)
        if st.guard_ramp is not None:
            ramp = st.guard_ramp * 2
            return 0, ramp if ramp < c.n_batch else None
        return 0, None
