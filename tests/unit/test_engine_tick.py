"""One-way data through the tick: the executor runs a Batch built by hand (no sequence, no
scheduler, no inbox), the host work between launch and collect happens while the device
computes, and the tick's parts reach the metrics."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import numpy as np
from test_engine_fake_runtime import VOCAB, FakeRuntime

from uma_serve.core import protocol as p
from uma_serve.core.engine import Engine, Submission
from uma_serve.core.engine.executor import Executor
from uma_serve.core.engine.tick import Batch, Draw, Failure
from uma_serve.core.policy import (
    BatchItem,
    Constraints,
    EngineStats,
    Phase,
    Plan,
    SchedulerState,
)
from uma_serve.core.policy.pipeline import build_policy
from uma_serve.core.protocol import Sampling
from uma_serve.core.runtime import Span
from uma_serve.core.sampling import Sampler, SamplerState

ROOT = Path(__file__).parents[2]


def greedy() -> SamplerState:
    return SamplerState(Sampling(temperature=0.0), 1)


def batch(spans: list[Span], draws: list[Draw | None]) -> Batch:
    items = tuple(
        BatchItem(s.seq_id, Phase.DECODE if d else Phase.PREFILL, len(s.tokens), s.logits)
        for s, d in zip(spans, draws, strict=True)
    )
    state = SchedulerState((), EngineStats(), 0)
    return Batch(Plan(items), state, tuple(spans), tuple(draws), abortable=False)


class AllRows(FakeRuntime):
    """As FakeRuntime, with a row for every token of a span with ``all_logits``."""

    def decode(self, spans):
        self._rows, rows = [], []
        for span in spans:
            n = len(span.tokens) if span.all_logits else int(span.logits)
            rows.append(len(self._rows) if n else -1)
            for j in range(len(span.tokens) - n, len(span.tokens)):
                row = np.zeros(VOCAB, dtype=np.float32)
                row[(span.pos + j + 1) % 10 + 1] = 1.0
                self._rows.append(row)
        return 0, rows


def test_the_executor_runs_a_batch_it_was_handed_and_nothing_else() -> None:
    """A prefill chunk without logits, a decode, and a decode with drafts verified row by
    row: the row after position q prefers token (q + 1) % 10 + 1."""
    rt = AllRows()
    ex = Executor(rt, Sampler(rt))  # type: ignore[arg-type]
    b = batch(
        [
            Span(0, 0, [5, 6, 7], False),
            Span(1, 3, [9], True),
            # positions 5..8: rows prefer 7, 8, 9, 10; the drafts agree twice, then differ
            Span(2, 5, [1, 7, 8, 4], True, all_logits=True),
        ],
        [None, Draw(greedy()), Draw(greedy(), drafts=(7, 8, 4))],
    )
    launched = ex.launch(b)
    result = ex.collect(launched, overlap_s=0.0, freed=False)
    assert result.failure is None and result.sample_ms >= 0.0
    assert [s.tokens for s in result.sampled] == [(), (5,), (7, 8, 9)]


def test_a_failed_decode_is_classified_and_undone_by_what_the_engine_says() -> None:
    class NoSlot(FakeRuntime):
        def __init__(self) -> None:
            super().__init__()
            self.trims: list[tuple[int, int]] = []

        def decode(self, spans):
            return 1, []

        def seq_trim(self, seq_id: int, from_pos: int) -> None:
            self.trims.append((seq_id, from_pos))

    rt = NoSlot()
    ex = Executor(rt, Sampler(rt))  # type: ignore[arg-type]
    b = batch([Span(3, 7, [1], True)], [Draw(greedy())])
    assert ex.collect(ex.launch(b), 0.0, freed=False).failure is Failure.NO_SLOT
    assert ex.collect(ex.launch(b), 0.001, freed=True).failure is Failure.RETRY
    assert rt.trims == [(3, 7), (3, 7)]


def test_the_executor_imports_no_sequence_scheduler_or_inbox() -> None:
    tree = ast.parse((ROOT / "core/engine/executor.py").read_text())
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    banned = {"sequence", "scheduler", "engine", "output"}
    assert not {m for m in modules if m and m.rsplit(".", 1)[-1] in banned}, modules


class Recording(FakeRuntime):
    """Logs decodes, clears and the wait for the device, in order."""

    def __init__(self) -> None:
        super().__init__(n_seq=2)
        self.log: list[str] = []

    def decode(self, spans):
        self.log.append("decode")
        return super().decode(spans)

    def synchronize(self) -> int:
        self.log.append("synchronize")
        return super().synchronize()

    def seq_clear(self, seq_id: int) -> None:
        self.log.append("clear")


def test_a_finished_sequence_is_released_between_launch_and_collect() -> None:
    """Its KV is freed while the device computes the next tick, and the tick's parts are
    recorded: one decode, one sampling and one overlap figure per tick."""
    events: list[tuple[int, p.Event]] = []
    done = threading.Event()

    def sink(batch):
        events.extend(batch)
        if sum(isinstance(e, p.EosEvent) for _, e in events) == 2:
            done.set()

    rt = Recording()
    policy = build_policy([])
    engine = Engine(rt, policy, Constraints(n_batch=64, tick_budget_ms=50.0), sink, seed=1)
    short = p.Generate(id="a", prompt="x", max_tokens=1, ignore_eos=True)
    long = p.Generate(id="b", prompt="x", max_tokens=3, ignore_eos=True)
    for r in (short, long):
        engine.submit(Submission((1, r.id), r, [1, 2, 3], 0))
    engine.start()
    assert done.wait(10), rt.log
    engine.stop("test over")
    engine.join(5)
    ticks = [e for e in rt.log if e != "clear"]
    assert ticks == ["decode", "synchronize"] * (len(ticks) // 2)
    # a ends in the first tick; its clear comes after the second tick's launch, before its wait
    second = [i for i, e in enumerate(rt.log) if e == "decode"][1]
    assert rt.log[second : second + 3] == ["decode", "clear", "synchronize"], rt.log
    h = engine.metrics.snapshot()["histograms"]
    n = engine.metrics.batch_calls_total
    assert n == 3 and h["tick_decode_ms"]["count"] == h["tick_sample_ms"]["count"] == n
    assert h["tick_overlap_ms"]["count"] == n


class Reusing(AllRows):
    """As AllRows, with llama.cpp's graph-reuse count: a decode of as many spans as the one
    before reuses its graph."""

    def __init__(self) -> None:
        super().__init__()
        self.reuses, self._last = 0, -1

    def decode(self, spans):
        self.reuses += len(spans) == self._last
        self._last = len(spans)
        return super().decode(spans)

    def graph_reuses(self) -> int:
        return self.reuses


def test_a_tick_says_whether_its_decode_reused_the_graph() -> None:
    rt = Reusing()
    ex = Executor(rt, Sampler(rt))  # type: ignore[arg-type]
    one, two = [Span(1, 3, [9], True)], [Span(1, 4, [9], True), Span(2, 4, [9], True)]
    reused = []
    for spans in (one, one, one, two, two, one):
        b = batch(spans, [Draw(greedy()) for _ in spans])
        reused.append(ex.collect(ex.launch(b), overlap_s=0.0, freed=False).graph_reused)
    assert reused == [False, True, True, False, True, False]
