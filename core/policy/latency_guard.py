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

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from uma_serve.core.policy.cost import TickCost, TickShape
from uma_serve.core.policy.plan import (
    BatchItem,
    Constraints,
    Phase,
    Plan,
    SessionView,
    item_shape,
    views_by_seq,
)
from uma_serve.core.policy.work import INTERACTIVE

if TYPE_CHECKING:
    from uma_serve.core.policy.state import SchedulerState

STARVED_CHUNK = 1  # tokens a starved session gets in a tick over budget
UNLIMITED = 1 << 30
MAX_RECOVERY_TICKS = 4  # slow ticks after a pause counted at most


@dataclass(frozen=True, slots=True)
class GuardState:
    """The guard's memory between ticks: ``observe`` steps it, ``LatencyGuard.apply`` reads it."""

    hold: int = 0  # ticks left during which bulk prefill is held
    ramp: int | None = None  # prefill cap while re-enabling after a hold (doubles each tick)
    # interactive ticks over budget right after a pause (a GPU re-captures its decode graph
    # after a prefill tick): counted while it lasts (None: not counting), then smoothed
    recovering: int | None = None
    recovery_ticks: float = 2.0  # as measured on an H100 (CUDA graph re-capture)
    overran: bool = False  # the last tick ran over its budget with bulk work in it


def observe(
    g: GuardState, ms: float, plan: Plan, views: dict[int, SessionView], cost: TickCost,
    c: Constraints,
) -> GuardState:  # fmt: skip
    """The state after a tick of ``ms`` that ran ``plan`` (``cost``: the model refitted with it).

    An overrun tick that carried bulk work holds bulk prefill for hold_ticks, then re-enables
    it with a cap that doubles each tick. A pause tick (stepped cost) holds it long enough that
    pauses, with the slow ticks that follow them, stretch one protected gap in pause_every; so
    does a chat turn's prompt tick, so that the new stream's first gaps are no pauses (they are
    its TTF5)."""
    interactive = [views[i.seq_id].qos == INTERACTIVE for i in plan.items]
    pause_hold = round(c.pause_every * (1.0 + g.recovery_ticks))
    if plan.pause:  # bulk work got its chunk: the next pause comes later
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
    if over and bulk:
        return replace(g, hold=max(c.hold_ticks, g.hold - 1), ramp=None, overran=True)
    if g.hold > 0:
        return replace(g, hold=g.hold - 1, ramp=1 if g.hold == 1 else None)
    if g.ramp is not None:
        ramp = g.ramp * 2
        return replace(g, ramp=ramp if ramp < c.n_batch else None)
    return g


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
            return replace(plan, items=tuple(kept), budget_ms=budget)
        held = protected and stats.guard.hold > 0
        prefill_cap = stats.guard.ramp if stats.guard.ramp is not None else UNLIMITED
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
            guard_active=plan.guard_active or trimmed or held,
            pause=pause,
        )
