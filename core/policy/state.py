"""The snapshot the policy plans from: the running sequences' views and what the engine has
learned (EngineStats), the tick it learns from (Tick), and the policy's two interfaces.

None of the transformers is named here: each keeps its own state in ``EngineStats.states``,
found by the state's type, and steps it with its own ``observe`` (core/policy/pipeline.py
lists them; core/engine/learner.py calls each after every tick).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import msgspec

from uma_serve.core.policy.cost import TickCost
from uma_serve.core.policy.plan import Constraints, Plan, SessionView

if TYPE_CHECKING:
    from uma_serve.core.metrics import EngineMetrics

S = TypeVar("S")


class EngineStats(msgspec.Struct, frozen=True):
    """What the engine learned from the ticks it ran (core/engine/learner.py)."""

    cost: TickCost = TickCost()  # the fitted tick-time model: the one cost estimate
    overhead_ms_ewma: float = 0.0  # engine time per tick outside llama_decode, smoothed
    tick: int = 0  # ticks run so far
    states: tuple[object, ...] = ()  # each listed transformer's own state

    def own(self, kind: type[S]) -> S:
        """A transformer's own state, found by its type (its initial value before any)."""
        for s in self.states:
            if type(s) is kind:
                return s
        return kind()


class SchedulerState(msgspec.Struct, frozen=True):
    sessions: tuple[SessionView, ...]
    stats: EngineStats
    now_ns: int
    last_interactive_ns: int = 0  # when an interactive request last ran or waited (0: never)


def views_by_seq(state: SchedulerState) -> dict[int, SessionView]:
    return {s.seq_id: s for s in state.sessions}


class Tick(msgspec.Struct, frozen=True):
    """A tick that ran, as the transformers learn from it: its time, the plan, the state it
    was planned from, the tick-time model refitted with it and the engine's constraints."""

    ms: float
    plan: Plan
    state: SchedulerState
    cost: TickCost
    constraints: Constraints

    @property
    def views(self) -> dict[int, SessionView]:
        return views_by_seq(self.state)


class Policy(Protocol):
    def schedule_tick(self, state: SchedulerState, constraints: Constraints) -> Plan: ...


@dataclass(frozen=True, slots=True)
class NoSettings:
    """The settings of a transformer that has none."""


@dataclass(frozen=True, slots=True)
class NoState:
    """The state of a transformer that keeps none."""


class PlanTransformer:
    """Rewrites a Plan; composed in sequence after the base policy. Its knobs are its own
    ``Settings`` (fields named as umad's options, core/config.py); one that learns from the
    ticks keeps its own ``State`` (frozen, in EngineStats.states), made by ``initial``, stepped
    by ``observe`` after every tick and shown in the metrics by ``report``."""

    Settings: ClassVar[type] = NoSettings
    State: ClassVar[type] = NoState

    def __init__(self, settings: Any = None) -> None:
        self.settings = self.Settings() if settings is None else settings

    def apply(self, plan: Plan, state: SchedulerState, c: Constraints) -> Plan:
        raise NotImplementedError

    def initial(self, c: Constraints) -> Any:
        return self.State()

    def observe(self, own: Any, tick: Tick) -> Any:
        return own

    def report(self, own: Any, tick: Tick, m: EngineMetrics) -> None:
        return None
