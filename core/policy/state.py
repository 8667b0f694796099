"""The snapshot the policy plans from: the running sequences' views and what the engine has
learned (EngineStats), and the policy's two interfaces."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from uma_serve.core.policy.cost import TickCost
from uma_serve.core.policy.latency_guard import GuardState
from uma_serve.core.policy.plan import Constraints, Plan, SessionView


@dataclass(frozen=True, slots=True)
class EngineStats:
    """What the engine learned from the ticks it ran (core/engine/learner.py)."""

    cost: TickCost = TickCost()  # the fitted tick-time model: the one cost estimate
    overhead_ms_ewma: float = 0.0  # engine time per tick outside llama_decode, smoothed
    tick: int = 0  # ticks run so far
    guard: GuardState = GuardState()  # the LatencyGuard's hysteresis
    bg_decoders_cap: int = 1 << 30  # S: background decoders served per tick (the tuner's)
    bg_burst: int = 1  # k: ticks a served background decoder keeps its turn (the tuner's)


@dataclass(frozen=True, slots=True)
class SchedulerState:
    sessions: tuple[SessionView, ...]
    stats: EngineStats
    now_ns: int
    last_interactive_ns: int = 0  # when an interactive request last ran or waited (0: never)


class Policy(Protocol):
    def schedule_tick(self, state: SchedulerState, constraints: Constraints) -> Plan: ...


class PlanTransformer(Protocol):
    """Rewrites a Plan; composed in sequence after the base policy."""

    def apply(self, plan: Plan, state: SchedulerState, constraints: Constraints) -> Plan: ...
