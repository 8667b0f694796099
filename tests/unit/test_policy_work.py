"""Work classes (policy/work.py): decode tokens protected, long prompts bulk, labels honored."""

from __future__ import annotations

import pytest

from uma_serve.core import protocol as p
from uma_serve.core.engine.sequence import Sequence
from uma_serve.core.engine.waiting import WaitingQueue
from uma_serve.core.policy import Constraints, EngineStats, Phase, SchedulerState, plan_shape
from uma_serve.core.policy.cost import TickCost, TickShape
from uma_serve.core.policy.latency_guard import LatencyGuard
from uma_serve.core.policy.pipeline import build_policy
from uma_serve.core.policy.work import (
    BACKGROUND,
    CHAT_TOKENS,
    INTERACTIVE,
    prompt_allowance,
    prompt_class,
)

CPU = TickCost(a=0.3, b=14.0, c=1.9, d=0.0, e=0.0, samples=100)
GPU = TickCost(a=0.1, b=1.4, c=0.016, d=0.0, e=3.0, samples=100)
C = Constraints(n_batch=512, tick_budget_ms=float("inf"), slo_ttft_ms=250.0, bg_tick_ms=60.0)


def test_allowance_is_what_one_tick_prefills_within_the_ttft_target_and_one_batch():
    # a GPU fits far more than a batch in 250 ms; a tick of a 2-core CPU fits ~130 tokens
    assert prompt_allowance(GPU, C) == C.n_batch
    assert int((250.0 - 0.3) / 1.9) == 131 < CHAT_TOKENS
    fast = TickCost(a=0.3, b=14.0, c=0.6, d=0.0, e=0.0, samples=100)  # a faster prefill
    assert prompt_allowance(fast, C) == int((250.0 - 0.3) / 0.6) == 416
    one_batch = Constraints(n_batch=300, tick_budget_ms=1, slo_ttft_ms=250.0)
    assert prompt_allowance(fast, one_batch) == 300


def test_a_typed_message_is_a_chat_turn_on_any_machine():
    """Below CHAT_TOKENS the allowance does not follow the tick-time model: a 150-token
    question that starts a conversation is a chat turn on a CPU too."""
    assert prompt_allowance(CPU, C) == CHAT_TOKENS
    tiny = Constraints(n_batch=512, tick_budget_ms=1, slo_ttft_ms=1.0)
    assert prompt_allowance(CPU, tiny) == CHAT_TOKENS
    assert prompt_allowance(CPU, Constraints(n_batch=128, tick_budget_ms=1)) == 128


@pytest.mark.parametrize(
    ("label", "uncached", "expected"),
    [
        ("interactive", 40, INTERACTIVE),
        ("interactive", 131, INTERACTIVE),
        ("interactive", 132, BACKGROUND),
        ("background", 4, BACKGROUND),
    ],
)
def test_prompt_class(label, uncached, expected):
    assert prompt_class(label, uncached, 131) == expected


def seq(prompt_len: int, qos: str = "interactive", bulk: bool = False, sid: int = 0) -> Sequence:
    req = p.Generate(id=f"r{sid}", prompt="x", qos=qos)  # type: ignore[arg-type]
    s = Sequence((1, req.id), req, list(range(prompt_len)), arrival_ns=sid, seq_id=sid)
    s.bulk_prompt = bulk
    return s


def test_a_pasted_prompt_is_bulk_until_done_then_its_stream_is_protected():
    paste = seq(1500, bulk=True)
    assert paste.view().qos == BACKGROUND and not paste.interactive
    paste.n_past = 1500  # prompt done: its answer streams like any chat
    assert paste.view().phase is Phase.DECODE and paste.view().qos == INTERACTIVE
    chat = seq(40)
    assert chat.view().qos == INTERACTIVE and chat.interactive
    batch_job = seq(40, qos="background")
    batch_job.n_past = 40
    assert batch_job.view().qos == BACKGROUND  # a label makes its decode bulk too


def test_a_chat_turn_is_admitted_before_queued_pastes_and_keeps_the_reserved_sequence():
    queue = WaitingQueue([0, 1], reserved=1)
    queue.waiting.extend([seq(1500, bulk=True, sid=1), seq(40, sid=2)])
    assert queue.has_interactive()
    first = queue.admit()
    assert first is not None and first.request.id == "r2"
    assert queue.admit() is None  # the paste may not take the last, reserved sequence


def test_guard_keeps_an_unlabeled_paste_out_of_the_chats_decode_ticks():
    """A chat decoding, a paste prefilling, nothing labeled: the paste gets only what fits
    the chat's budget (CPU: a few tokens), not a TTFT-first chunk."""
    chat, paste = seq(40, sid=0), seq(1500, bulk=True, sid=1)
    chat.n_past, chat.next_token = 40, 7
    state = SchedulerState((chat.view(), paste.view()), EngineStats(cost=CPU), 10**10, 10**10)
    plan = build_policy(["qos", "latency"]).schedule_tick(state, C)
    prefill = sum(i.n_tokens for i in plan.items if i.phase is Phase.PREFILL)
    views = {v.seq_id: v for v in state.sessions}
    assert CPU.predict(plan_shape(plan.items, views)) <= 1.2 * CPU.predict(TickShape(1, 0, 0.0))
    assert plan.items[0].seq_id == 0 and prefill == 1  # 2.9 ms of room at 1.9 ms a token
    unlabeled_as_chat = seq(1500, sid=1)  # the same prompt treated as a chat turn
    state = SchedulerState(
        (chat.view(), unlabeled_as_chat.view()), EngineStats(cost=CPU), 10**10, 10**10
    )
    plan = LatencyGuard().apply(build_policy([]).schedule_tick(state, C), state, C)
    assert sum(i.n_tokens for i in plan.items if i.phase is Phase.PREFILL) > 100


def test_a_single_sequence_is_never_reserved():
    """With one sequence a long prompt must still run: the reservation leaves it free."""
    queue = WaitingQueue([0], reserved=1)
    queue.waiting.append(seq(1500, bulk=True, sid=1))
    admitted = queue.admit()
    assert admitted is not None and admitted.seq_id == 0
