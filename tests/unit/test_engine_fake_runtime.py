"""The engine's executor logic on a fake runtime (no model): admission, queueing, ends."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from uma_serve.core import protocol as p
from uma_serve.core.engine import Engine, Submission
from uma_serve.core.metrics import EngineMetrics
from uma_serve.core.policy import BaselinePolicy, Constraints
from uma_serve.core.runtime import RuntimeParams
from uma_serve.core.runtime.api import RuntimeApi

VOCAB = 16


class FakeRuntime:
    """Decodes instantly; every logits row prefers token (position % 10) + 1."""

    def __init__(self, n_seq: int = 4) -> None:
        self.params = RuntimeParams(model_path="fake", n_seq=n_seq)
        self.n_ctx = 1024
        self.n_ctx_per_seq = self.n_ctx // n_seq
        self.n_batch = 64
        self._rows: list[np.ndarray] = []
        self._rc = 0

    def decode(self, spans):
        self._rows, rows = [], []
        for span in spans:
            if span.logits:
                row = np.zeros(VOCAB, dtype=np.float32)
                row[(span.pos + len(span.tokens)) % 10 + 1] = 1.0
                rows.append(len(self._rows))
                self._rows.append(row)
            else:
                rows.append(-1)
        return 0, rows

    def logits_row(self, row: int) -> np.ndarray:
        return self._rows[row]

    def piece(self, token: int) -> bytes:
        return f"<{token}>".encode()

    def is_eog(self, token: int) -> bool:
        return False

    def seq_clear(self, seq_id: int) -> None: ...

    def seq_trim(self, seq_id: int, from_pos: int) -> None: ...

    def seq_copy(self, src: int, dst: int, n: int) -> None: ...

    def abort(self) -> None: ...

    def clear_abort(self) -> None: ...

    def launch(self, spans, on_thread: bool = False) -> list[int]:
        self._rc, rows = self.decode(spans)
        return rows

    def synchronize(self) -> int:
        return self._rc

    def graph_reuses(self) -> int:  # no graphs: every tick counts as one built anew
        return 0

    # no device top-k, no llama.cpp chains, no prefix cache files here
    def candidates(self, rows):
        raise NotImplementedError

    def wide_candidates(self, row, k):
        raise NotImplementedError

    def set_device_chain(self, seq_id: int, k: int) -> None:
        raise NotImplementedError

    def grammar(self, text: str):
        raise NotImplementedError

    def seq_save(self, path: str, seq_id: int, tokens: list[int]) -> bool:
        raise NotImplementedError

    def seq_load(self, path: str, seq_id: int, capacity: int) -> list[int] | None:
        raise NotImplementedError

    def seq_state(self, seq_id: int) -> bytes:
        raise NotImplementedError

    def seq_restore(self, seq_id: int, data: bytes) -> bool:
        raise NotImplementedError

    def clear_all(self) -> None:
        raise NotImplementedError


def test_the_fake_runtime_implements_the_engines_runtime_protocol() -> None:
    assert isinstance(FakeRuntime(), RuntimeApi)


def run_engine(
    requests: list[p.Generate], n_seq: int = 4, metrics: list[EngineMetrics] | None = None
) -> list[tuple[int, p.Event]]:
    """The requests' events, each request's prompt 3 tokens; ``metrics`` gets the engine's."""
    events: list[tuple[int, p.Event]] = []
    done = threading.Event()

    def sink(batch):
        events.extend(batch)
        finals = [e for _, e in events if isinstance(e, p.EosEvent | p.ErrorEvent)]
        if len(finals) == len(requests):
            done.set()

    engine = Engine(
        FakeRuntime(n_seq),
        BaselinePolicy(),
        Constraints(n_batch=64, tick_budget_ms=50.0),
        sink,
        seed=1,
    )
    for i, r in enumerate(requests):  # all in the inbox before the engine's first look
        engine.submit(Submission((1, r.id), r, [1, 2, 3], i))
    engine.start()
    assert done.wait(10), f"engine stalled; {len(events)} events"
    engine.stop("test over")
    engine.join(5)
    if metrics is not None:
        metrics.append(engine.metrics)
    return events


def test_a_whole_batch_ending_in_one_tick_lets_the_queue_in() -> None:
    reqs = [p.Generate(id=f"r{i}", prompt="x", max_tokens=5, ignore_eos=True) for i in range(8)]
    got: list[EngineMetrics] = []
    events = run_engine(reqs, metrics=got)
    ends = [e for _, e in events if isinstance(e, p.EosEvent)]
    assert sorted(e.id for e in ends) == sorted(r.id for r in reqs)
    assert all(e.reason == "length" and e.usage.completion_tokens == 5 for e in ends)
    sizes = got[0].snapshot()["token_histograms"]  # each finished request's size, once
    assert (sizes["prompt_tokens"]["count"], sizes["prompt_tokens"]["sum"]) == (8, 24)
    assert (sizes["generation_tokens"]["count"], sizes["generation_tokens"]["sum"]) == (8, 40)


def test_tokens_follow_the_logits_and_positions() -> None:
    events = run_engine([p.Generate(id="a", prompt="x", max_tokens=4, temperature=0.0)])
    tokens = [e.token_id for _, e in events if isinstance(e, p.TokenEvent)]
    assert tokens == [4, 5, 6, 7]  # prompt of 3 tokens: positions 3, 4, 5, 6 -> +1


class SlowRuntime(FakeRuntime):
    """The first tick of the background prompt takes long unless aborted (like a 512-token
    prefill); every other tick is instant."""

    def __init__(self) -> None:
        super().__init__()
        self._aborted = threading.Event()
        self.aborts = 0
        self.long_ticks = threading.Event()  # set when a long tick has started

    def abort(self) -> None:
        self._aborted.set()

    def clear_abort(self) -> None:
        self._aborted.clear()

    def decode(self, spans):
        if not self.long_ticks.is_set() and any(len(span.tokens) > 4 for span in spans):
            self.long_ticks.set()
            if self._aborted.wait(30):
                self.aborts += 1
                return 2, []
        return super().decode(spans)


@pytest.mark.parametrize("doc_qos", ["background", "interactive"])
def test_an_interactive_arrival_aborts_a_long_background_tick(doc_qos) -> None:
    """A chat turn cuts short a tick of bulk work only: a labeled document's, or an unlabeled
    one's whose prompt is over the interactive allowance (99 tokens; one batch, 64, here)."""
    from uma_serve.core.policy.pipeline import build_policy

    events: list[tuple[int, p.Event]] = []
    done = threading.Event()

    def sink(batch):
        events.extend(batch)
        if any(isinstance(e, p.EosEvent) and e.id == "chat" for _, e in batch):
            done.set()

    rt = SlowRuntime()
    engine = Engine(
        rt,
        build_policy(["qos", "latency"]),
        Constraints(n_batch=64, tick_budget_ms=50.0),
        sink,
        seed=1,
    )
    engine.start()
    doc = p.Generate(id="doc", prompt="x", max_tokens=2, qos=doc_qos, ignore_eos=True)
    assert engine.prompt_allowance() < 99
    engine.submit(Submission((1, "doc"), doc, list(range(1, 100)), 0))
    assert rt.long_ticks.wait(10)
    chat = p.Generate(id="chat", prompt="x", max_tokens=3, ignore_eos=True)
    engine.submit(Submission((1, "chat"), chat, [1, 2, 3], 1))
    # the long tick gives way at once: the chat finishes while the document would still wait
    assert done.wait(10), "the interactive request waited for the background tick"
    assert rt.aborts == 1 and engine.metrics.ticks_aborted_total == 1
    engine.stop("test over")
    engine.join(5)


def test_compute_threads_run_at_a_raised_nice_value() -> None:
    """The engine thread (and so llama.cpp's workers it starts) yields to the I/O threads."""
    import os

    engine = Engine(
        FakeRuntime(),
        BaselinePolicy(),
        Constraints(n_batch=64, tick_budget_ms=50.0),
        lambda batch: None,
        compute_nice=3,
    )
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    engine.start()
    try:
        deadline = time.monotonic() + 5
        tid = engine._thread.native_id
        while os.getpriority(os.PRIO_PROCESS, tid) != min(before + 3, 19):
            assert time.monotonic() < deadline, "the engine thread's nice value was not raised"
            time.sleep(0.01)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before  # I/O side
    finally:
        engine.stop("test over")
        engine.join(5)


class EndsSink:
    """The engine's sink for a test: keeps every event, and ``done`` is set once ``n``
    requests have ended (an EosEvent or an ErrorEvent each)."""

    def __init__(self, n: int) -> None:
        self.events: list[tuple[int, p.Event]] = []
        self.done = threading.Event()
        self._n = n

    def __call__(self, batch: list[tuple[int, p.Event]]) -> None:
        self.events.extend(batch)
        ends = sum(isinstance(e, p.EosEvent | p.ErrorEvent) for _, e in self.events)
        if ends == self._n:
            self.done.set()


class TightRuntime(FakeRuntime):
    """KV for ``capacity`` positions in all: a decode that does not fit returns 1 and stores
    nothing. Records the order of decodes and clears."""

    def __init__(self, capacity: int) -> None:
        super().__init__(n_seq=2)
        self.capacity = capacity
        self.held: dict[int, int] = {}  # seq_id -> positions with KV
        self.log: list[str] = []

    def decode(self, spans):
        if sum(self.held.values()) + sum(len(s.tokens) for s in spans) > self.capacity:
            self.log.append("decode: no slot")
            return 1, []
        for s in spans:
            self.held[s.seq_id] = s.pos + len(s.tokens)
        self.log.append("decode " + " ".join(str(s.seq_id) for s in spans))
        return super().decode(spans)

    def seq_clear(self, seq_id: int) -> None:
        if self.held.pop(seq_id, 0):
            self.log.append(f"clear {seq_id}")

    def seq_trim(self, seq_id: int, from_pos: int) -> None:
        if seq_id in self.held:
            self.held[seq_id] = min(self.held[seq_id], from_pos)


def test_an_ended_sequence_keeps_its_kv_until_the_next_decode_and_a_full_one_is_retried() -> None:
    """A finished sequence's KV is freed just after the next llama_decode returns (on a GPU
    while the device computes), not in the tick it ended. When that decode found no slot only
    because the finished sequence still held its cells, the tick is retried: both requests
    complete, nothing is evicted or failed."""
    sink = EndsSink(2)
    events, done = sink.events, sink.done
    runtime = TightRuntime(capacity=8)  # prompts of 3 + 3, a decode each, then one too many
    engine = Engine(runtime, BaselinePolicy(), Constraints(n_batch=64, tick_budget_ms=50.0), sink)
    short = p.Generate(id="a", prompt="x", max_tokens=2, ignore_eos=True)
    long = p.Generate(id="b", prompt="x", max_tokens=5, ignore_eos=True)
    for r in (short, long):
        engine.submit(Submission((1, r.id), r, [1, 2, 3], 0))
    engine.start()
    assert done.wait(10), f"engine stalled; {runtime.log}"
    engine.stop("test over")
    engine.join(5)
    ends = {e.id: e for _, e in events if isinstance(e, p.EosEvent)}
    assert ends["a"].usage.completion_tokens == 2 and ends["b"].usage.completion_tokens == 5
    assert ends["b"].reason == "length"
    # a ends with its second token (tick 2) and keeps its cells through tick 3's decode, which
    # finds no slot; a's cells go right after it, and the retried tick fits
    first, second, failed, cleared, retried = runtime.log[:5]
    assert first == second and len(first.split()) == 3, runtime.log  # both prompts, both decode
    assert failed == "decode: no slot" and cleared.startswith("clear "), runtime.log
    a_id = cleared.split()[1]
    assert retried == "decode " + next(i for i in first.split()[1:] if i != a_id), runtime.log
    assert engine.metrics.decode_failures_total == 1
