"""A base policy followed by Plan transformers, each switchable by configuration.

``TRANSFORMERS`` is the one registry: the name ``--policy`` lists, the class (its own
``Settings``, read from umad's options of the same names, its own ``State`` and ``observe``
step: core/policy/state.py), and the options its being listed or not decides. Everything
else (the config's check of ``--policy``, the daemon, the engine's learner) reads it from here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from uma_serve.core.policy.baseline import BaselinePolicy
from uma_serve.core.policy.bmt import BmtGuard
from uma_serve.core.policy.lanes import QosLanes
from uma_serve.core.policy.latency_guard import LatencyGuard
from uma_serve.core.policy.plan import Constraints, Plan
from uma_serve.core.policy.spec import SpeculativeDecode
from uma_serve.core.policy.state import PlanTransformer, Policy, SchedulerState

Options = Mapping[str, Any]  # umad's options by name (core/config.py's Config as a dict)


@dataclass(frozen=True)
class Registered:
    """A transformer as --policy names it. ``listed``: options it takes over while listed;
    ``unlisted``: options it owns, at their off value while it is not listed."""

    kind: type[PlanTransformer]
    listed: Mapping[str, Any] = field(default_factory=dict)
    unlisted: Mapping[str, Any] = field(default_factory=dict)


TRANSFORMERS: dict[str, Registered] = {
    # the reserved sequence exists for the lanes' chat turns
    "qos": Registered(QosLanes, unlisted={"reserved_interactive_seqs": 0}),
    # before the guards, so they budget the drafted tokens; no drafts proposed without it
    "spec": Registered(SpeculativeDecode, unlisted={"spec_draft": 0}),
    # it owns every time budget: the baseline only shares the tokens
    "latency": Registered(LatencyGuard, listed={"tick_budget_ms": math.inf}),
    "bmt": Registered(BmtGuard),
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


def option_overrides(names: Sequence[str]) -> dict[str, Any]:
    """The options whose values follow from which transformers ``names`` lists."""
    out: dict[str, Any] = {}
    for name, entry in TRANSFORMERS.items():
        out.update(entry.listed if name in names else entry.unlisted)
    return out


def settings(kind: type, options: Options) -> Any:
    """A transformer's Settings: its fields from the options of the same names, the rest at
    their defaults."""
    if not is_dataclass(kind):
        return kind()
    names = {f.name for f in fields(kind)}
    return kind(**{k: v for k, v in options.items() if k in names})


def build_policy(names: Sequence[str], options: Options | None = None) -> PolicyPipeline:
    """``names`` in pipeline order, from TRANSFORMERS (e.g. ["qos", "latency", "bmt"]), each
    with its settings from ``options`` (none: the defaults)."""
    unknown = [n for n in names if n not in TRANSFORMERS]
    if unknown:
        raise ValueError(f"unknown policy transformer(s) {unknown}; known: {list(TRANSFORMERS)}")
    kinds = [TRANSFORMERS[n].kind for n in names]
    return PolicyPipeline(BaselinePolicy(), [k(settings(k.Settings, options or {})) for k in kinds])
