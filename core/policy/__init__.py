"""Scheduling policy: pure functions from an immutable SchedulerState to a Plan.

Nothing here imports llama_cpp, asyncio or sockets; the engine executes whatever Plan it gets.
"""

from uma_serve.core.policy.baseline import BaselinePolicy
from uma_serve.core.policy.plan import (
    BatchItem,
    Constraints,
    ModelFacts,
    Phase,
    Plan,
    SessionView,
    plan_shape,
)
from uma_serve.core.policy.state import (
    EngineStats,
    PlanTransformer,
    Policy,
    SchedulerState,
    Tick,
    views_by_seq,
)

__all__ = [
    "BaselinePolicy",
    "BatchItem",
    "Constraints",
    "EngineStats",
    "Policy",
    "ModelFacts",
    "PlanTransformer",
    "Phase",
    "Plan",
    "SchedulerState",
    "SessionView",
    "Tick",
    "plan_shape",
    "views_by_seq",
]
