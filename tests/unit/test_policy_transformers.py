"""QoS lanes, LatencyGuard, ΣBMT guard and the pipeline on hand-built states."""

from __future__ import annotations

from msgspec.structs import replace

from uma_serve.core.engine.learner import TickLearner
from uma_serve.core.metrics import EngineMetrics
from uma_serve.core.policy import (
    BatchItem,
    Constraints,
    EngineStats,
    Phase,
    Plan,
    SchedulerState,
    SessionView as View,
)
from uma_serve.core.policy.bmt import BmtGuard, BmtSettings, tick_bytes, weight_bytes
from uma_serve.core.policy.cost import TickCost, TickShape
from uma_serve.core.policy.lanes import QosLanes, Turns
from uma_serve.core.policy.latency_guard import (
    STARVED_CHUNK,
    GuardSettings,
    GuardState,
    LatencyGuard,
    Pause,
)
from uma_serve.core.policy.pipeline import build_policy
from uma_serve.core.policy.plan import ModelFacts, item_shape, plan_shape

NOW = 10_000_000_000
COST = TickCost(a=15.0, b=3.0, c=3.0, d=0.0, samples=100)  # decode 1: 18 ms; +3 ms per token
C = Constraints(n_batch=512, tick_budget_ms=float("inf"), bg_tick_ms=120.0)
HEADROOM = GuardSettings().headroom  # 0.2


def view(seq, phase, qos="interactive", pending=0, n_past=50, progress=NOW, burst=0):
    return View(seq, phase, qos, 50, n_past, pending, 0, 0, None, None, progress, burst)


def state(*views, guard_hold: int = 0, guard_ramp: int | None = None, **turns) -> SchedulerState:
    own = (GuardState(hold=guard_hold, ramp=guard_ramp), Turns(**turns))
    return SchedulerState(tuple(views), EngineStats(cost=COST, states=own), NOW)


def predicted(plan: Plan, st: SchedulerState) -> float:
    """The tick-time model's prediction for a plan (what the metrics report)."""
    return st.stats.cost.predict(plan_shape(plan.items, {v.seq_id: v for v in st.sessions}))


def dec(seq: int) -> BatchItem:
    return BatchItem(seq, Phase.DECODE, 1, True)


def pre(seq: int, n: int, logits: bool = False) -> BatchItem:
    return BatchItem(seq, Phase.PREFILL, n, logits)


# ---- QoS ----


def test_qos_serves_all_interactive_and_caps_background_fairly() -> None:
    st = state(
        view(0, Phase.DECODE),
        view(1, Phase.DECODE, "background", progress=NOW - 5),
        view(2, Phase.DECODE, "background", progress=NOW - 9),  # waited longest
        view(3, Phase.DECODE, "background", progress=NOW - 1),
        cap=1,
    )
    plan = QosLanes().apply(Plan((dec(1), dec(2), dec(3), dec(0))), st, C)
    assert [i.seq_id for i in plan.items] == [0, 2]
    assert set(plan.parked) == {1, 3}


def test_qos_burst_keeps_a_turn_for_k_ticks() -> None:
    st = state(
        view(1, Phase.DECODE, "background", progress=NOW, burst=1),  # mid-turn
        view(2, Phase.DECODE, "background", progress=NOW - 9),
        cap=1,
        burst=3,
    )
    plan = QosLanes().apply(Plan((dec(1), dec(2))), st, C)
    assert [i.seq_id for i in plan.items] == [1]


def test_qos_puts_interactive_prefill_first() -> None:
    st = state(view(1, Phase.PREFILL, "background", 300), view(2, Phase.PREFILL, pending=500))
    plan = QosLanes().apply(Plan((pre(1, 300), pre(2, 200))), st, C)
    assert [i.seq_id for i in plan.items] == [2, 1]


# ---- LatencyGuard ----


def test_guard_admits_only_prefill_that_fits_while_interactive_decodes() -> None:
    # solo tick 18 ms, budget 21.6 ms: one 3 ms prefill token fits
    st = state(view(0, Phase.DECODE), view(1, Phase.PREFILL, "background", 1000))
    plan = LatencyGuard().apply(Plan((dec(0), pre(1, 500))), st, C)
    assert [(i.seq_id, i.n_tokens) for i in plan.items] == [(0, 1), (1, 1)]
    assert plan.guard_active and abs(plan.budget_ms - 21.6) < 1e-9
    assert predicted(plan, st) <= plan.budget_ms


def test_guard_parks_background_decoders_that_do_not_fit() -> None:
    st = state(view(0, Phase.DECODE), view(1, Phase.DECODE, "background"))
    tight = LatencyGuard(GuardSettings(headroom=0.1))  # 19.8 ms < 21
    plan = tight.apply(Plan((dec(0), dec(1))), st, C)
    assert [i.seq_id for i in plan.items] == [0] and plan.parked == (1,)


def test_guard_explicit_slo() -> None:
    guard = LatencyGuard(GuardSettings(slo_tbt_ms=30.0))
    st = state(view(0, Phase.DECODE), view(1, Phase.PREFILL, "background", 1000))
    plan = guard.apply(Plan((dec(0), pre(1, 500))), st, C)
    assert plan.items[1].n_tokens == 4  # (30 - 18) / 3


def test_guard_bounds_ticks_without_interactive_decoders() -> None:
    st = state(view(1, Phase.PREFILL, "background", 1000))
    plan = LatencyGuard().apply(Plan((pre(1, 512),)), st, C)
    assert plan.items[0].n_tokens == 35  # (120 - 15) / 3
    assert not plan.items[0].logits


def test_guard_lets_background_ticks_run_whole_once_interactive_traffic_is_quiet() -> None:
    from msgspec.structs import replace

    guard = LatencyGuard(GuardSettings(quiet_ms=1000.0))
    bg = view(1, Phase.PREFILL, "background", 1000)
    recent = SchedulerState((bg,), EngineStats(cost=COST), NOW, last_interactive_ns=NOW - 500e6)
    quiet = replace(recent, last_interactive_ns=NOW - 1500e6)
    plan = Plan((pre(1, 512),))
    assert guard.apply(plan, recent, C).items[0].n_tokens == 35  # bg_tick_ms bound
    assert guard.apply(plan, quiet, C).items[0].n_tokens == 512  # the whole batch
    assert LatencyGuard().apply(plan, quiet, C).items[0].n_tokens == 35  # quiet_ms 0: off


def test_guard_lets_a_new_interactive_prompt_stretch_the_tick() -> None:
    st = state(view(0, Phase.DECODE), view(1, Phase.PREFILL, pending=20))
    plan = LatencyGuard().apply(Plan((dec(0), pre(1, 20, True))), st, C)
    assert plan.items[1] == pre(1, 20, True)


def test_guard_hold_stops_background_prefill_then_ramp_caps_it() -> None:
    views = (view(0, Phase.DECODE), view(1, Phase.PREFILL, "background", 1000))
    loose = LatencyGuard(GuardSettings(slo_tbt_ms=60.0))
    held = loose.apply(Plan((dec(0), pre(1, 500))), state(*views, guard_hold=3), C)
    assert [i.seq_id for i in held.items] == [0] and held.guard_active
    ramp = loose.apply(Plan((dec(0), pre(1, 500))), state(*views, guard_ramp=2), C)
    assert ramp.items[1].n_tokens == 2


GPU = TickCost(a=1.2, b=0.02, c=0.025, d=0.0, e=2.7, samples=100)  # any prefill: +2.7 ms


def test_guard_pauses_for_a_whole_prefill_tick_when_cost_is_stepped() -> None:
    views = (view(0, Phase.DECODE), view(1, Phase.PREFILL, "background", 1000))
    plan = Plan((dec(0), pre(1, 500)))
    st = SchedulerState(views, EngineStats(cost=GPU, overhead_ms_ewma=0.3), NOW)
    paused = LatencyGuard().apply(plan, st, C)
    # a step's worth of prompt: the gap it stretches pays the step twice, no more
    assert paused.noted(Pause) and paused.items == (dec(0), pre(1, int(GPU.e / GPU.c)))
    assert paused.budget_ms == GPU.predict(plan_shape((dec(0),), {0: views[0]})) + 2 * GPU.e
    held = LatencyGuard().apply(
        plan, replace(st, stats=replace(st.stats, states=(GuardState(hold=5),))), C
    )
    assert not held.noted(Pause) and held.items == (dec(0),)
    # the same shape on a linear (CPU-like) machine is trimmed, never paused
    linear = LatencyGuard().apply(plan, state(*views), C)
    assert not linear.noted(Pause) and linear.items[1].n_tokens < 500


def test_a_new_interactive_prompt_carries_no_bulk_prefill_when_cost_is_stepped() -> None:
    """The chat turn's tick is its TTFT: bulk prompts do not ride along (on an H100 a whole
    batch added ~10 ms, TTFT 1.7-2.4x solo); its first gap may be a pause instead."""
    views = (view(0, Phase.PREFILL, pending=40), view(1, Phase.PREFILL, "background", 1000))
    plan = Plan((pre(0, 40, True), pre(1, 500)))
    st = SchedulerState(views, EngineStats(cost=GPU), NOW)
    alone = LatencyGuard().apply(plan, st, C)
    chat_tick = GPU.predict(plan_shape((pre(0, 40, True),), {0: views[0]}))
    assert alone.items[0] == pre(0, 40, True) and not alone.noted(Pause)
    assert predicted(alone, st) <= (1 + HEADROOM) * chat_tick  # within the headroom only
    assert alone.items[1].n_tokens < 50
    decoding = (view(0, Phase.DECODE), views[1])  # its first decode tick: a pause may come
    first = LatencyGuard().apply(Plan((dec(0), pre(1, 500))), state(*decoding), C)
    assert first.items[0] == dec(0)
    first = LatencyGuard().apply(
        Plan((dec(0), pre(1, 500))), SchedulerState(decoding, EngineStats(cost=GPU), NOW), C
    )
    assert first.noted(Pause) and first.items[1].seq_id == 1


def test_a_starved_prompt_gets_a_pause_not_a_token_when_cost_is_stepped() -> None:
    old = NOW - int(2500e6)  # 2.5 s without progress > starve_ms 2 s
    views = (view(0, Phase.DECODE), view(1, Phase.PREFILL, "background", 1000, progress=old))
    st = SchedulerState(views, EngineStats(cost=GPU, states=(GuardState(hold=50),)), NOW)
    plan = LatencyGuard().apply(Plan((dec(0), pre(1, 500))), st, C)
    assert plan.noted(Pause) and plan.items == (dec(0), pre(1, int(GPU.e / GPU.c)))


def test_a_pause_tick_holds_prefill_for_pause_every_ticks() -> None:
    learner = TickLearner(C, [LatencyGuard(GuardSettings(pause_every=20))])
    views = (view(0, Phase.DECODE), view(1, Phase.PREFILL, "background", 1000))
    st = SchedulerState(views, EngineStats(cost=GPU), NOW)
    plan = Plan((dec(0), pre(1, 500)), budget_ms=C.bg_tick_ms, notes=(Pause(),))
    m = EngineMetrics()
    learner.record(15.0, plan, st, m)
    guard = learner.stats.own(GuardState)
    assert guard.hold == 60 and guard.ramp is None  # 20 x (1 + 2)
    assert m.ticks_paused_total == 1 and m.snapshot()["ticks_paused_total"] == 1
    # no slow interactive tick after the pause (r: 2 -> 1), then a pause, then three slow
    # ones (a GPU re-capturing its graph; r: 1 -> 2)
    decode = Plan((dec(0),), budget_ms=2.0)
    learner.record(1.5, decode, st, m)
    learner.record(15.0, plan, st, m)
    assert learner.stats.own(GuardState).hold == 40
    for ms in (3.0, 3.0, 3.0, 1.5):
        learner.record(ms, decode, st, m)
    assert learner.stats.own(GuardState).hold == 36
    learner.record(15.0, plan, st, m)
    assert learner.stats.own(GuardState).hold == 60


def test_guard_never_starves_a_session() -> None:
    old = NOW - int(2500e6)  # 2.5 s without progress > starve_ms 2 s
    st = state(
        view(0, Phase.DECODE),
        view(1, Phase.PREFILL, "background", 1000, progress=old),
        view(2, Phase.DECODE, "background", progress=old),
        guard_hold=5,
    )
    plan = LatencyGuard().apply(Plan((dec(0), dec(2), pre(1, 500))), st, C)
    assert (2, 1) in [(i.seq_id, i.n_tokens) for i in plan.items]
    assert (1, STARVED_CHUNK) in [(i.seq_id, i.n_tokens) for i in plan.items]


# ---- ΣBMT ----

FACTS = ModelFacts(weights_bytes=1_000_000, kv_bytes_per_cell=100)


def test_bmt_estimate_counts_weights_once_and_kv_per_token() -> None:
    views = {0: view(0, Phase.DECODE, n_past=99), 1: view(1, Phase.PREFILL, pending=10, n_past=0)}
    assert tick_bytes((dec(0),), views, FACTS) == 1_000_000 + 100 * 100
    assert tick_bytes((pre(1, 10),), views, FACTS) == 1_000_000 + 10 * 5.5 * 100


def test_moe_weights_grow_with_tokens_up_to_all_experts() -> None:
    moe = ModelFacts(weights_bytes=1000, kv_bytes_per_cell=0, n_expert=8, n_expert_used=2)
    assert weight_bytes(moe, 1) < weight_bytes(moe, 2) < weight_bytes(moe, 100) == 1000


def test_bmt_guard_trims_background_first_and_is_off_by_default() -> None:
    st = state(
        view(0, Phase.DECODE),
        view(1, Phase.DECODE, "background"),
        view(2, Phase.PREFILL, "background", 1000, n_past=0),
    )
    plan = Plan((dec(0), dec(1), pre(2, 200)), budget_ms=20.0)
    assert BmtGuard().apply(plan, st, C) is plan
    c = Constraints(n_batch=512, tick_budget_ms=1.0, model=FACTS)
    out = BmtGuard(BmtSettings(0.0506)).apply(plan, st, c)  # 1.012 MB in 20 ms: weights + two
    assert [i.seq_id for i in out.items] == [0, 1] and out.guard_active
    out = BmtGuard(BmtSettings(0.0501)).apply(plan, st, c)
    assert [i.seq_id for i in out.items] == [0] and out.parked == (1,)


# ---- pipeline ----


def test_pipeline_storm_keeps_interactive_tick_near_solo() -> None:
    st = state(
        view(0, Phase.DECODE),
        *(view(i, Phase.PREFILL, "background", 1500, n_past=0) for i in (1, 2, 3)),
    )
    plan = build_policy(["qos", "latency", "bmt"]).schedule_tick(st, C)
    assert plan.items[0] == dec(0)
    solo = COST.predict(plan_shape((dec(0),), {v.seq_id: v for v in st.sessions}))
    assert predicted(plan, st) <= solo * 1.2


def test_unknown_transformer_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="unknown"):
        build_policy(["qos", "warp-drive"])


def test_guard_keeps_a_minimum_background_chunk_when_the_model_says_nothing_fits() -> None:
    slow = TickCost(a=500.0, b=3.0, c=3.0, d=0.0, samples=100)  # a slow moment of the machine
    st = SchedulerState((view(1, Phase.PREFILL, "background", 1000),), EngineStats(cost=slow), NOW)
    plan = LatencyGuard().apply(Plan((pre(1, 512),)), st, C)
    assert plan.items[0].n_tokens == C.min_prefill_tokens


def test_interactive_prompt_alone_is_not_chunked() -> None:
    st = state(view(1, Phase.PREFILL, pending=400))
    plan = LatencyGuard().apply(Plan((pre(1, 400, True),)), st, C)
    assert plan.items[0] == pre(1, 400, True)


def test_two_new_interactive_prompts_alone_are_not_chunked() -> None:
    st = state(view(1, Phase.PREFILL, pending=40), view(2, Phase.PREFILL, pending=30))
    plan = LatencyGuard().apply(Plan((pre(2, 30, True), pre(1, 40, True))), st, C)
    assert [(i.seq_id, i.n_tokens) for i in plan.items] == [(2, 30), (1, 40)]


def test_infinite_budget_is_safe() -> None:
    assert COST.prefill_that_fits(1, 0.0, float("inf")) == 1 << 30


def test_a_chat_turn_holds_bulk_prefill_where_cost_is_stepped() -> None:
    """A new stream's first gaps are its TTF5: no pause lands on them (a GPU); on a CPU (no
    step) a chat turn starts no hold."""
    views = (view(0, Phase.PREFILL, pending=40), view(1, Phase.PREFILL, "background", 1000))
    turn = Plan((pre(0, 40, True),), budget_ms=10.0)
    m = EngineMetrics()
    guard = LatencyGuard(GuardSettings(pause_every=20))
    gpu = TickLearner(C, [guard])
    gpu._model._cost = GPU  # a fitted step
    gpu.record(5.0, turn, SchedulerState(views, EngineStats(cost=GPU), NOW), m)
    assert gpu.stats.own(GuardState).hold == 60  # 20 x (1 + 2)
    cpu = TickLearner(C, [guard])
    cpu._model._cost = COST
    cpu.record(5.0, turn, SchedulerState(views, EngineStats(cost=COST), NOW), m)
    assert cpu.stats.own(GuardState).hold == 0


def test_a_plans_shape_is_the_sum_of_its_items_shapes() -> None:
    """plan_shape adds the items up in place: the same shape as item_shape's, summed."""
    items = (dec(0), pre(1, 40), BatchItem(2, Phase.DECODE, 4, True), pre(3, 1, True), dec(4))
    views = {i: view(i, Phase.DECODE, n_past=17 * i + 3) for i in range(5)}
    summed = TickShape(0, 0, 0.0)
    for item in items:
        summed = summed + item_shape(item, views[item.seq_id])
    assert plan_shape(items, views) == summed
