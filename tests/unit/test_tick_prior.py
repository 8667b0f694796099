"""The tick-time model before a context has measured its own ticks: a GPU's prior is
GPU-sized, so a burst of chat turns arriving beside a decoding stream is prefilled in one
tick, not two prompts a tick (the CPU-sized prior's 3 ms a prompt token)."""

from __future__ import annotations

from uma_serve.core import config as cfg
from uma_serve.core.daemon import constraints
from uma_serve.core.engine.learner import TickLearner
from uma_serve.core.policy import ModelFacts
from uma_serve.core.policy.cost import GPU_PRIOR, TickCost
from uma_serve.core.policy.pipeline import build_policy
from uma_serve.core.policy.plan import Phase
from uma_serve.core.policy.state import SchedulerState, SessionView

NOW = 10_000_000_000


def view(seq: int, phase: Phase, pending: int = 0) -> SessionView:
    return SessionView(seq, phase, "interactive", 50, 50, pending, 0, 0, None, None, NOW, 0)


def burst_plan(on_gpu: bool) -> list[tuple[int, str, int]]:
    """What a fresh context plans for one decoding stream and 15 new 46-token chat turns."""
    c = constraints(cfg.Config(), ModelFacts(), on_gpu)
    pipeline = build_policy(["qos", "spec", "latency", "bmt"])
    learner = TickLearner(c, pipeline.transformers)
    views = (view(0, Phase.DECODE), *(view(i, Phase.PREFILL, 46) for i in range(1, 16)))
    plan = pipeline.schedule_tick(SchedulerState(views, learner.stats, NOW), c)
    return [(i.seq_id, i.phase.name, i.n_tokens) for i in plan.items]


def test_the_daemon_gives_a_gpu_the_gpu_prior() -> None:
    assert constraints(cfg.Config(), ModelFacts(), on_gpu=True).tick_prior == GPU_PRIOR
    assert constraints(cfg.Config(), ModelFacts(), on_gpu=False).tick_prior == TickCost()


def test_a_fresh_learner_plans_with_the_prior() -> None:
    for on_gpu, prior in ((True, GPU_PRIOR), (False, TickCost())):
        learner = TickLearner(constraints(cfg.Config(), ModelFacts(), on_gpu))
        assert learner.stats.cost == prior  # the first plan's model, before any tick


def test_a_burst_of_chat_turns_is_prefilled_together_on_a_gpu() -> None:
    gpu = burst_plan(on_gpu=True)
    prompts = [n for _, phase, n in gpu if phase == "PREFILL"]
    # whole prompts up to the batch (512 tokens: the decode row and 11 prompts, the 12th cut)
    assert prompts[:11] == [46] * 11 and sum(prompts) == 512 - 1
    cpu = burst_plan(on_gpu=False)
    whole = [n for _, phase, n in cpu if phase == "PREFILL" and n == 46]
    assert len(whole) <= 2  # the CPU's prior: a prompt token costs 3 ms of a 250 ms stretch
