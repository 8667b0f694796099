"""The plan transformers' one registry (core/policy/pipeline.py): each with its own settings,
state and observe step, read generically by the engine's learner; the contract (state.py,
plan.py), the learner, the daemon and the config know none of them by name."""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from uma_serve.core import config as cfg
from uma_serve.core.engine.learner import TickLearner
from uma_serve.core.metrics import EngineMetrics
from uma_serve.core.policy import (
    Constraints,
    EngineStats,
    Phase,
    Plan,
    PlanTransformer,
    SchedulerState,
    SessionView,
    Tick,
)
from uma_serve.core.policy.lanes import QosLanes, Turns
from uma_serve.core.policy.latency_guard import GuardState, LatencyGuard
from uma_serve.core.policy.pipeline import TRANSFORMERS, build_policy, option_overrides

ROOT = Path(__file__).parents[2]
C = Constraints(n_batch=64, tick_budget_ms=50.0)
TRANSFORMER_MODULES = {"latency_guard", "lanes", "spec", "bmt", "tuner"}


def source_imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def strings(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


@pytest.mark.parametrize(
    "path", ["core/policy/state.py", "core/policy/plan.py", "core/engine/learner.py",
             "core/engine/scheduler.py", "core/engine/engine.py", "core/daemon.py"],
)  # fmt: skip
def test_the_contract_and_the_engine_import_no_transformer(path: str) -> None:
    named = {n.rsplit(".", 1)[-1] for n in source_imports(ROOT / path)}
    assert not named & TRANSFORMER_MODULES, f"{path}: {sorted(named & TRANSFORMER_MODULES)}"


@pytest.mark.parametrize("path", ["core/daemon.py", "core/config.py"])
def test_the_daemon_and_the_config_branch_on_no_transformer_name(path: str) -> None:
    assert not strings(ROOT / path) & set(TRANSFORMERS), path
    assert tuple(TRANSFORMERS) == cfg.POLICY_TRANSFORMERS


def test_what_listing_a_transformer_decides_of_the_options() -> None:
    assert option_overrides(list(TRANSFORMERS)) == {"tick_budget_ms": math.inf}
    assert option_overrides([]) == {"reserved_interactive_seqs": 0, "spec_draft": 0}


def test_each_transformer_takes_its_settings_from_the_options_of_the_same_names() -> None:
    options = {"hold_ticks": 3, "headroom": 0.5, "tuner": "on", "n_seq": 6, "n_ctx": 9}
    guard, lanes = build_policy(["latency", "qos"], options).transformers
    assert isinstance(guard, LatencyGuard) and isinstance(lanes, QosLanes)
    assert (guard.settings.hold_ticks, guard.settings.headroom) == (3, 0.5)
    assert guard.settings.pause_every == 100  # not in the options: its default
    turns = lanes.initial(C)
    assert turns.tuner is not None and turns.tuner.s == 6  # S starts at its ceiling
    assert QosLanes().initial(C) == Turns()  # no tuner: every background decoder


@dataclass(frozen=True, slots=True)
class EveryOther:
    """A toy rule's knob."""

    every: int = 2


@dataclass(frozen=True, slots=True)
class Seen:
    ticks: int = 0


class SkipPrefill(PlanTransformer):
    """A new scheduling rule with a knob: prefill only every ``every`` ticks it has seen."""

    Settings = EveryOther
    State = Seen
    settings: EveryOther

    def apply(self, plan: Plan, state: SchedulerState, c: Constraints) -> Plan:
        if state.stats.own(Seen).ticks % self.settings.every == 0:
            return plan
        return Plan(tuple(i for i in plan.items if i.phase is Phase.DECODE), plan.parked)

    def observe(self, own: Seen, tick: Tick) -> Seen:
        return Seen(own.ticks + 1)

    def report(self, own: Seen, tick: Tick, m: EngineMetrics) -> None:
        m.parked_sessions = own.ticks  # (any figure: that it is called)


def test_a_new_rule_with_a_knob_is_registered_once_and_learns_through_the_learner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from uma_serve.core.policy import pipeline

    monkeypatch.setitem(pipeline.TRANSFORMERS, "skip", pipeline.Registered(SkipPrefill))
    policy = build_policy(["latency", "skip"], {"every": 3})
    learner = TickLearner(C, policy.transformers)
    views = (
        SessionView(0, Phase.DECODE, "interactive", 5, 5, 0, 1, 0),
        SessionView(1, Phase.PREFILL, "interactive", 50, 0, 50, 0, 0),
    )
    m, kept = EngineMetrics(), []
    for _ in range(6):
        st = SchedulerState(views, learner.stats, 0)
        plan = policy.schedule_tick(st, C)
        kept.append(any(i.phase is Phase.PREFILL for i in plan.items))
        learner.record(10.0, plan, st, m)
    assert kept == [True, False, False, True, False, False]
    assert learner.stats.own(Seen) == Seen(6) and m.parked_sessions == 6
    assert isinstance(learner.stats.own(GuardState), GuardState)  # the guard's, beside it
    assert EngineStats().own(Seen) == Seen()  # before any tick: the initial state
