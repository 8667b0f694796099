"""QoS decode lanes: interactive decoders always served; background decoders capped at S
per tick and rotated fairly (least recently served first, keeping a turn for k ticks);
interactive prefill ahead of background prefill.

S and k are the lanes' own state (``Turns``): unbounded and 1, or with ``--tuner`` what the
sweet-spot tuner (core/policy/tuner.py) finds, stepped after every tick by ``observe``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from msgspec.structs import replace

from uma_serve.core.policy.plan import Constraints, Phase, Plan, SessionView
from uma_serve.core.policy.state import PlanTransformer, SchedulerState, Tick, views_by_seq
from uma_serve.core.policy.tuner import SweetSpotTuner
from uma_serve.core.policy.work import INTERACTIVE

if TYPE_CHECKING:
    from uma_serve.core.metrics import EngineMetrics


def background_turn_order(decoders: list[SessionView], burst: int) -> list[SessionView]:
    """Decoders mid-turn (served fewer than k ticks in a row) first, then the longest unserved."""
    return sorted(
        decoders,
        key=lambda s: (not (0 < s.burst < burst), s.last_progress_ns, s.seq_id),
    )


@dataclass(frozen=True, slots=True)
class LaneSettings:
    """The lanes' knobs (umad's options of the same names)."""

    tuner: bool | str = False  # hill-climb S and k ("on" as the option spells it)
    n_seq: int = 4  # S at most: the sequences decoded in parallel


@dataclass(frozen=True, slots=True)
class Turns:
    """S (background decoders served per tick) and k (ticks a served background decoder
    keeps its turn), and the tuner that moves them (None: off)."""

    cap: int = 1 << 30
    burst: int = 1
    tuner: SweetSpotTuner | None = field(default=None, compare=False)


class QosLanes(PlanTransformer):
    Settings = LaneSettings
    State = Turns
    settings: LaneSettings

    def initial(self, c: Constraints) -> Turns:
        if self.settings.tuner not in (True, "on"):
            return Turns()
        return Turns(tuner=SweetSpotTuner(self.settings.n_seq, moe=c.model.n_expert > 0))

    def observe(self, own: Turns, tick: Tick) -> Turns:
        if own.tuner is None:
            return own
        own.tuner.observe(tick.plan.n_tokens, tick.ms, contended=bool(tick.plan.parked))
        return Turns(own.tuner.s, own.tuner.k, own.tuner)

    def report(self, own: Turns, tick: Tick, m: EngineMetrics) -> None:
        m.bg_decoders_cap = own.cap if own.tuner is not None else 0
        m.bg_burst = own.burst

    def apply(self, plan: Plan, state: SchedulerState, c: Constraints) -> Plan:
        views = views_by_seq(state)
        turns = state.stats.own(Turns)
        decode = [i for i in plan.items if i.phase is Phase.DECODE]
        prefill = [i for i in plan.items if i.phase is Phase.PREFILL]
        fg = [i for i in decode if views[i.seq_id].qos == INTERACTIVE]
        bg_views = [views[i.seq_id] for i in decode if views[i.seq_id].qos != INTERACTIVE]
        order = background_turn_order(bg_views, turns.burst)
        served = {s.seq_id for s in order[: turns.cap]}
        bg = [i for i in decode if i.seq_id in served]
        parked = tuple(s.seq_id for s in order[turns.cap :])
        prefill.sort(key=lambda i: views[i.seq_id].qos != INTERACTIVE)  # stable: SRPT kept
        return replace(plan, items=tuple(fg + bg + prefill), parked=plan.parked + parked)
