"""BaselinePolicy on hand-built states."""

from uma_serve.core.policy import (
    BaselinePolicy,
    Constraints,
    EngineStats,
    Phase,
    SchedulerState,
    SessionView,
)
from uma_serve.core.policy.cost import TickCost


def view(seq: int, phase: Phase, pending: int = 0, arrival: int = 0) -> SessionView:
    return SessionView(
        seq_id=seq,
        phase=phase,
        qos="interactive",
        prompt_len=max(pending, 1),
        n_past=0,
        pending_prefill=pending,
        generated=0,
        arrival_ns=arrival,
    )


def plan_for(sessions, stats=EngineStats(), **kw):
    c = Constraints(n_batch=kw.pop("n_batch", 512), tick_budget_ms=kw.pop("budget", 50.0), **kw)
    return BaselinePolicy().schedule_tick(SchedulerState(tuple(sessions), stats, 0), c)


def test_every_decoder_gets_one_token_first() -> None:
    plan = plan_for([view(0, Phase.PREFILL, 1000), view(1, Phase.DECODE), view(2, Phase.DECODE)])
    assert [(i.seq_id, i.phase, i.n_tokens) for i in plan.items[:2]] == [
        (1, Phase.DECODE, 1),
        (2, Phase.DECODE, 1),
    ]
    assert all(i.logits for i in plan.items[:2])


def test_prefill_fills_the_batch_when_nobody_decodes() -> None:
    plan = plan_for([view(0, Phase.PREFILL, 1000)], n_batch=512)
    assert [(i.seq_id, i.n_tokens, i.logits) for i in plan.items] == [(0, 512, False)]


def test_last_chunk_asks_for_logits() -> None:
    plan = plan_for([view(0, Phase.PREFILL, 100)])
    assert [(i.n_tokens, i.logits) for i in plan.items] == [(100, True)]


def test_shortest_prompt_first_with_burst() -> None:
    sessions = [view(0, Phase.PREFILL, 900, arrival=1), view(1, Phase.PREFILL, 50, arrival=2)]
    plan = plan_for(sessions, n_batch=512, prefill_burst=128)
    assert [(i.seq_id, i.n_tokens) for i in plan.items] == [(1, 50), (0, 462)]


def test_prefill_limited_by_tick_budget_while_decoding() -> None:
    stats = EngineStats(cost=TickCost(a=20.0, b=0.0, c=0.5, d=0.0, samples=100))
    sessions = [view(0, Phase.DECODE), view(1, Phase.PREFILL, 1000)]
    plan = plan_for(sessions, stats=stats, budget=50.0)
    assert plan.items[1].n_tokens == 60  # (50 - 20) / 0.5


def test_prefill_never_starves_below_min_chunk() -> None:
    stats = EngineStats(cost=TickCost(a=80.0, b=0.0, c=0.5, d=0.0, samples=100))
    plan = plan_for([view(0, Phase.DECODE), view(1, Phase.PREFILL, 1000)], stats=stats)
    assert plan.items[1].n_tokens == 16


def test_cap_after_failed_decode() -> None:
    plan = plan_for([view(1, Phase.PREFILL, 1000)], max_prefill_tokens=64)
    assert plan.n_tokens == 64


def test_no_sessions_empty_plan() -> None:
    assert plan_for([]).empty
