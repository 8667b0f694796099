"""A base policy followed by Plan transformers, each switchable by configuration."""

from __future__ import annotations

from collections.abc import Sequence

from uma_serve.core.policy.baseline import BaselinePolicy
from uma_serve.core.policy.bmt import BmtGuard
from uma_serve.core.policy.lanes import QosLanes
from uma_serve.core.policy.latency_guard import LatencyGuard
from uma_serve.core.policy.plan import Constraints, Plan
from uma_serve.core.policy.spec import SpeculativeDecode
from uma_serve.core.policy.state import PlanTransformer, Policy, SchedulerState

TRANSFORMERS: dict[str, type] = {
    "qos": QosLanes,
    "spec": SpeculativeDecode,  # before the guards, so they budget the drafted tokens
    "latency": LatencyGuard,
    "bmt": BmtGuard,
}


class PolicyPipeline:
    def __init__(self, base: Policy, transformers: Sequence[PlanTransformer]) -> None:
        self.base = base
        self.transformers = list(transformers)

    def schedule_tick(self, state: SchedulerState, constraints: Constraints) -> Plan:
        plan = self.base.schedule_tick(state, constraints)
        for transformer in self.transformers:
            plan = transformer.apply(plan, state, constraints)
        return plan


def build_policy(names: Sequence[str]) -> PolicyPipeline:
    """``names`` in pipeline order, from TRANSFORMERS (e.g. ["qos", "latency", "bmt"])."""
    unknown = [n for n in names if n not in TRANSFORMERS]
    if unknown:
        raise ValueError(f"unknown policy transformer(s) {unknown}; known: {list(TRANSFORMERS)}")
    return PolicyPipeline(BaselinePolicy(), [TRANSFORMERS[n]() for n in names])
