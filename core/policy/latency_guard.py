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

Hysteresis (``GuardState``, stepped by ``observe`` after every tick): after a tick that
overran its budget bulk prefill is held for ``hold_ticks`` ticks, then capped by a ramp that
doubles each tick. Nothing starves: a session not advanced for ``starve_ms`` gets one token
even over budget.

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

from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
from msgspec.structs import replace

from uma_serve.core.policy.cost import TickCost, TickShape
from uma_serve.core.policy.plan import (
    BatchItem,
    Constraints,
    Phase,
    Plan,
    SessionView,
    item_shape,
    plan_shape,
)
from uma_serve.core.policy.state import PlanTransformer, SchedulerState, Tick, views_by_seq
from uma_serve.core.policy.work import INTERACTIVE

if TYPE_CHECKING:
    from uma_serve.core.metrics import EngineMetrics

STARVED_CHUNK = 1  # tokens a starved session gets in a tick over budget
UNLIMITED = 1 << 30
MAX_RECOVERY_TICKS = 4  # slow ticks after a pause counted at most


@dataclass(frozen=True, slots=True)
class GuardSettings:
    """The guard's knobs (umad's options of the same names, docs/CONFIG.md)."""

    slo_tbt_ms: float = 0.0  # 0: (1 + headroom) x the predicted protected tick
    headroom: float = 0.2
    # no interactive request for this long: ticks without interactive work are bounded by
    # n_batch only (the engine aborts such a tick when an interactive request arrives); 0: off
    quiet_ms: float = 0.0
    hold_ticks: int = 8  # hysteresis: ticks without background prefill after an overrun
    pause_every: int = 100  # stepped tick cost: pauses stretch one interactive gap in this many


class Pause(msgspec.Struct, frozen=True):
    """The guard's note on a pause: a stepped-cost prefill tick among protected ones."""

    def __str__(self) -> str:
        return "pause"


class GuardState(msgspec.Struct, frozen=True):
    """The guard's memory between ticks: ``observe`` steps it, ``LatencyGuard.apply`` reads it."""

    hold: int = 0  # ticks left during which bulk prefill is held
    ramp: int | None = None  # prefill cap while re-enabling after a hold (doubles each tick)
    # interactive ticks over budget right after a pause (a GPU re-captures its decode graph
    # after a prefill tick): counted while it lasts (None: not counting), then smoothed
    recovering: int | None = None
    recovery_ticks: float = 2.0  # as measured on an H100 (CUDA graph re-capture)
    overran: bool = False  # the last tick ran over its budget with bulk work in it


def observe(g: GuardState, tick: Tick, s: GuardSettings) -> GuardState:
    """The state after a tick (its cost: the model refitted with it).

    An overrun tick that carried bulk work holds bulk prefill for hold_ticks, then re-enables
    it with a cap that doubles each tick. A pause tick (stepped cost) holds it long enough that
    pauses, with the slow ticks that follow them, stretch one protected gap in pause_every; so
    does a chat turn's prompt tick, so that the new stream's first gaps are no pauses (they are
    its TTF5)."""
    ms, plan, views, cost, c = tick.ms, tick.plan, tick.views, tick.cost, tick.constraints
    interactive = [views[i.seq_id].qos == INTERACTIVE for i in plan.items]
    pause_hold = round(s.pause_every * (1.0 + g.recovery_ticks))
    if plan.noted(Pause):  # bulk work got its chunk: the next pause comes later
        return GuardState(pause_hold, None, 0, g.recovery_ticks)
    chat_turn = any(
        i.phase is Phase.PREFILL and fg for i, fg in zip(plan.items, interactive, strict=True)
    )
    if chat_turn and cost.stepped(c.min_prefill_tokens):
        return replace(g, hold=max(g.hold, pause_hold), ramp=None, overran=False)
    over = plan.budget_ms is not None and ms > plan.budget_ms
    recovering, r = g.recovering, g.recovery_ticks
    if recovering is not None and any(interactive):
        if over and recovering < MAX_RECOVERY_TICKS:
            recovering += 1
        else:
            recovering, r = None, 0.5 * (r + recovering)
    g = GuardState(g.hold, g.ramp, recovering, r)
    bulk = any(
        i.phase is Phase.PREFILL or not fg for i, fg in zip(plan.items, interactive, strict=True)
    )
    if over and bulk and _bulk_caused(ms, plan, views, cost):
        return replace(g, hold=max(s.hold_ticks, g.hold - 1), ramp=None, overran=True)
    if g.hold > 0:
        return replace(g, hold=g.hold - 1, ramp=1 if g.hold == 1 else None)
    if g.ramp is not None:
        ramp = g.ramp * 2
        return replace(g, ramp=ramp if ramp < c.n_batch else None)
    return g


def _bulk_caused(ms: float, plan: Plan, views: dict[int, SessionView], cost: TickCost) -> bool:
    """Whether the bulk work's predicted share made the tick overrun: without it the tick
    would have kept its budget. An overrun that the protected work alone explains is the
    machine's noise (another process, a frequency drop); holding bulk prefill for it would
    starve long prompts on a busy machine, a few tokens every hold_ticks ticks."""
    protected = tuple(i for i in plan.items if views[i.seq_id].qos == INTERACTIVE)
    bulk_ms = cost.predict(plan_shape(plan.items, views)) - cost.predict(
        plan_shape(protected, views)
    )
    return ms - bulk_ms <= (plan.budget_ms or 0.0)


class _Kept:
    """The items a tick keeps so far, and their shape for the tick-time model."""

    def __init__(self, state: SchedulerState, c: Constraints, s: GuardSettings) -> None:
        self.views = views_by_seq(state)
        self.state, self.c, self.s, self.cost = state, c, s, state.stats.cost
        self.items: list[BatchItem] = []
        self.shape = TickShape(0, 0, 0.0)

    def keep(self, item: BatchItem) -> None:
        self.items.append(item)
        self.shape = self.shape + item_shape(item, self.views[item.seq_id])

    def keep_chunk(self, item: BatchItem, n: int) -> None:
        self.keep(replace(item, n_tokens=n, logits=n == self.views[item.seq_id].pending_prefill))

    def room(self, budget: float) -> int:
        """Prompt tokens that still fit ``budget`` (ms) by the model."""
        s = self.shape
        return self.cost.prefill_that_fits(s.decode, s.kv_k, budget) - s.prefill

    def fits(self, item: BatchItem, budget: float) -> bool:
        return self.cost.predict(self.shape + item_shape(item, self.views[item.seq_id])) <= budget

    def starved(self, item: BatchItem) -> bool:
        last = self.views[item.seq_id].last_progress_ns
        return self.state.now_ns - last > self.c.starve_ms * 1e6


class LatencyGuard(PlanTransformer):
    Settings = GuardSettings
    State = GuardState
    settings: GuardSettings

    def observe(self, own: GuardState, tick: Tick) -> GuardState:
        return observe(own, tick, self.settings)

    def report(self, own: GuardState, tick: Tick, m: EngineMetrics) -> None:
        m.ticks_paused_total += tick.plan.noted(Pause) is not None
        m.ticks_over_budget_total += own.overran
        m.prefill_guard_active |= own.hold > 0

    def apply(self, plan: Plan, state: SchedulerState, c: Constraints) -> Plan:
        if plan.empty:
            return plan
        t = _Kept(state, c, self.settings)
        protected_ids = {i.seq_id for i in plan.items if t.views[i.seq_id].qos == INTERACTIVE}
        self._keep_protected(t, [i for i in plan.items if i.seq_id in protected_ids])
        protected = bool(t.items)
        budget = self._budget(t, protected)
        bulk = [i for i in plan.items if i.seq_id not in protected_ids]
        if not bulk:
            return replace(plan, items=tuple(t.items), budget_ms=budget)
        g, cost = state.stats.own(GuardState), t.cost
        held = protected and g.hold > 0
        prefill_cap = g.ramp if g.ramp is not None else UNLIMITED
        bulk_prefill = [i for i in bulk if i.phase is Phase.PREFILL]
        # a starved prompt's forced progress comes as a pause too: a one-token chunk would pay
        # the whole step (and the slow ticks after it) for one token
        pause = (
            protected
            and bool(bulk_prefill)
            and cost.stepped(c.min_prefill_tokens)
            and (not held or any(t.starved(i) for i in bulk_prefill))
            and t.room(budget) < c.min_prefill_tokens
        )
        if pause:  # the stretched gap: the protected work, the step and a step's worth of tokens
            budget = min(c.bg_tick_ms, cost.predict(t.shape) + 2 * cost.e)
            prefill_cap, held = UNLIMITED, False
        parked = self._fill_bulk(t, bulk, budget, protected, held, prefill_cap)
        trimmed = sum(i.n_tokens for i in t.items) < plan.n_tokens
        return replace(
            plan,
            items=tuple(t.items),
            parked=plan.parked + tuple(parked),
            budget_ms=budget,
            guard_active=plan.guard_active or trimmed or held,
            notes=plan.notes + ((Pause(),) if pause else ()),
        )

    @staticmethod
    def _keep_protected(t: _Kept, protected: list[BatchItem]) -> None:
        """Every protected decode; chat turns' prompts in chunks that fit the stretch while
        other streams decode, as fast as the base plan allows when none does."""
        for item in protected:
            if item.phase is Phase.DECODE:
                t.keep(item)
        decoding = bool(t.items)
        stretch = t.c.slo_ttft_ms or t.c.bg_tick_ms
        for item in protected:
            if item.phase is Phase.PREFILL:
                n = min(item.n_tokens, max(t.room(stretch) if decoding else item.n_tokens, 1))
                t.keep_chunk(item, n)

    @staticmethod
    def _budget(t: _Kept, protected: bool) -> float:
        """The tick's time budget (predicted decode time, ms)."""
        s, st = t.s, t.state
        if protected:
            overhead = st.stats.overhead_ms_ewma
            solo = t.cost.predict(t.shape) + overhead
            return (s.slo_tbt_ms or solo * (1.0 + s.headroom)) - overhead
        if s.quiet_ms and st.now_ns - st.last_interactive_ns > s.quiet_ms * 1e6:
            return UNLIMITED  # abortable: no conversation is going on
        return t.c.bg_tick_ms

    @staticmethod
    def _fill_bulk(
        t: _Kept, bulk: list[BatchItem], budget: float, protected: bool, held: bool, cap: int
    ) -> list[int]:
        """Bulk work in the plan's order while it fits; the decoders left out (parked)."""
        parked: list[int] = []
        for item in bulk:
            if item.phase is Phase.DECODE:
                if t.fits(item, budget) or t.starved(item):
                    t.keep(item)
                else:
                    parked.append(item.seq_id)
                continue
            # unprotected ticks always carry a minimum chunk: a mis-predicting model (a slow
            # moment of the machine) must not stall bulk prompts
            floor = 0 if protected else t.c.min_prefill_tokens
            n = 0 if held else min(item.n_tokens, max(t.room(budget), floor, 0), cap)
            if n <= 0 and t.starved(item):
                n = min(item.n_tokens, STARVED_CHUNK)
            if n > 0:
                t.keep_chunk(item, n)
        return parked
