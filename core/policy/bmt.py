"""ΣBMT guard: keep the bytes a tick moves within bandwidth x time budget.

Bytes per tick ≈ the weights once (a dense model reads them all for any batch; a MoE model
reads the shared part plus the experts its tokens route to, at most all of them) + the KV
cache each token attends to (n_past cells x bytes per cell). Over budget, background prefill
is trimmed first, then background decoders are parked. Off unless ``bmt_budget`` (GB/s) is
set (``bench calibrate`` measures the machine's effective bandwidth for the loaded model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from msgspec.structs import replace

from uma_serve.core.policy.plan import (
    BatchItem,
    Constraints,
    ModelFacts,
    Phase,
    Plan,
    SessionView,
)
from uma_serve.core.policy.state import PlanTransformer, SchedulerState, Tick, views_by_seq
from uma_serve.core.policy.work import INTERACTIVE

if TYPE_CHECKING:
    from uma_serve.core.metrics import EngineMetrics

MOE_EXPERT_SHARE = 0.9  # fraction of a MoE model's weights that sit in its experts (estimate)


def weight_bytes(model: ModelFacts, n_tokens: int) -> float:
    if n_tokens == 0:
        return 0.0
    if model.n_expert <= 0:
        return float(model.weights_bytes)
    experts = model.weights_bytes * MOE_EXPERT_SHARE
    touched = min(model.n_expert, n_tokens * max(model.n_expert_used, 1))
    return model.weights_bytes - experts + experts * touched / model.n_expert


def tick_bytes(items: tuple[BatchItem, ...], views: dict[int, SessionView], m: ModelFacts) -> float:
    kv = 0.0
    for item in items:
        past = views[item.seq_id].n_past
        kv += item.n_tokens * (past + (item.n_tokens + 1) / 2) * m.kv_bytes_per_cell
    return weight_bytes(m, sum(i.n_tokens for i in items)) + kv


@dataclass(frozen=True, slots=True)
class BmtSettings:
    """The guard's knob (umad's option of the same name)."""

    bmt_budget: float = 0.0  # the machine's effective bandwidth, GB/s (0: off)


class BmtGuard(PlanTransformer):
    Settings = BmtSettings
    settings: BmtSettings

    def report(self, own: object, tick: Tick, m: EngineMetrics) -> None:
        gbs = self.settings.bmt_budget
        m.bmt_budget = gbs * 1e9
        model = tick.constraints.model
        m.bmt_estimate_last = tick_bytes(tick.plan.items, tick.views, model) if gbs else 0.0

    def apply(self, plan: Plan, state: SchedulerState, c: Constraints) -> Plan:
        if not self.settings.bmt_budget or plan.empty:
            return plan
        views = views_by_seq(state)
        time_ms = plan.budget_ms or c.bg_tick_ms
        budget = self.settings.bmt_budget * 1e9 * time_ms / 1e3
        items = list(plan.items)
        parked: list[int] = []

        def over() -> bool:
            return tick_bytes(tuple(items), views, c.model) > budget

        # trim from the back: background prefill, then background decoders, never interactive
        for phase in (Phase.PREFILL, Phase.DECODE):
            for item in reversed(list(items)):
                if not over():
                    break
                if item.phase is not phase or views[item.seq_id].qos == INTERACTIVE:
                    continue
                items.remove(item)
                if phase is Phase.DECODE:
                    parked.append(item.seq_id)
        return replace(
            plan,
            items=tuple(items),
            parked=plan.parked + tuple(parked),
            guard_active=plan.guard_active or len(items) < len(plan.items),
        )
