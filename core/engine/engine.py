"""The engine: a thread that runs ticks, each one llama_decode.

    planned = scheduler.plan()                    # tick N+1's plan, while tick N computes
    out = executor.collect(launched)              # tick N: the device done, its rows sampled
    events = scheduler.advance(batch, seqs, out)  # tokens -> text, stops, ends (sent at once)
    batch = scheduler.batch(planned)              # tick N+1's spans, with tick N's tokens
    launched = executor.launch(batch)             # llama_decode (a GPU computes after it)
    seqs = scheduler.launched(batch)              # its sequences where it leaves them
    scheduler.record(...)                         # the learner learns tick N meanwhile

On a GPU a tick stays in flight between two steps: llama_decode returns once the graph is
launched, so the host work of a step (tokens to events and the learner, the inbox, admissions,
the next plan, releasing finished sequences' KV) runs while the device computes, and only
sampling, the output step and llama_decode's own host work lie between two ticks. A plan made
before the last tick's tokens are known keeps its sequences' places: a sequence that tick
ended drops out of the batch. With speculative drafts the plan waits for the tokens, which its
drafts continue. On a CPU, whose llama_decode computes the tick, a step launches and collects
its own tick (``overlap`` off).

The I/O thread talks to it only through ``submit``/``cancel``/``cancel_connection``/``stop``,
which post to the ``Inbox`` under one Condition; the engine thread takes everything posted at
once between ticks (and again after admitting, so requests that arrived meanwhile join the
tick) and gets each tick's events to ``sink`` in one call. With no work the
thread sleeps on the Condition: no polling, no fixed sleeps.

The inbox also holds the abort window, which the engine opens around the launch of a tick
that no interactive request waits on (a long background tick, docs/POLICY.md "Quiet
periods"): an interactive arrival then stops that decode at once instead of waiting for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import msgspec

from uma_serve.core.engine.executor import Executor
from uma_serve.core.engine.nice import lower_current_thread
from uma_serve.core.engine.scheduler import Scheduler
from uma_serve.core.engine.sequence import RequestKey, Sequence, Submission
from uma_serve.core.engine.tick import Batch, Launched, Outgoing, TickResult
from uma_serve.core.metrics import EngineMetrics
from uma_serve.core.policy import Constraints, Policy
from uma_serve.core.policy.work import INTERACTIVE, prompt_class
from uma_serve.core.prefix.index import block_hashes
from uma_serve.core.runtime.api import RuntimeApi
from uma_serve.core.sampling import Sampler

log = logging.getLogger("uma.engine")
Sink = Callable[[list[Outgoing]], None]
JOIN_ROUNDS = 4  # takes of late arrivals before a tick at most (each may admit some)


class Cancel(msgspec.Struct, frozen=True, tag=True):
    """Cancel one request (a client's cancel)."""

    key: RequestKey


class CancelConnection(msgspec.Struct, frozen=True, tag=True):
    """Cancel every request of a connection (it closed)."""

    conn_id: int


# what the inbox carries besides the stop order: a tagged union, handled with ``match``
Op = Submission | Cancel | CancelConnection


class Inbox:
    def __init__(self, abort: Callable[[], None], clear_abort: Callable[[], None]) -> None:
        self._cond = threading.Condition()
        self._items: deque[Op] = deque()
        self._stop_reason: str | None = None
        self._abort, self._clear_abort = abort, clear_abort
        self._window_open = False
        self._interactive_waiting = False  # an interactive arrival the engine has not taken

    # ---- I/O thread ----

    def post(self, op: Op, interactive: bool = False) -> None:
        with self._cond:
            self._items.append(op)
            if interactive:
                self._interactive_waiting = True
                if self._window_open:
                    self._abort()
            self._cond.notify()

    def stop(self, reason: str) -> None:
        with self._cond:
            self._stop_reason = reason
            self._cond.notify()

    # ---- engine thread ----

    def take(
        self, busy: Callable[[], bool], on_idle: Callable[[], None]
    ) -> tuple[list[Op], str | None]:
        """Everything posted so far and the stop reason (if any); sleeps while there is
        nothing to take and ``busy()`` is false."""
        with self._cond:
            while not (self._items or self._stop_reason or busy()):
                on_idle()
                self._cond.wait()
            return self._drain(), self._stop_reason

    def take_ready(self) -> list[Op]:
        """What was posted since the last take, without waiting (the stop order stays)."""
        with self._cond:
            return self._drain()

    def _drain(self) -> list[Op]:  # under the lock
        items = list(self._items)
        self._items.clear()
        self._interactive_waiting = False
        return items

    @contextmanager
    def abort_window(self, abortable: bool) -> Iterator[None]:
        """Around an abortable decode's launch: an interactive arrival not yet taken, or one
        posted while it runs, aborts it."""
        if not abortable:
            yield
            return
        with self._cond:
            self._window_open = True
            if self._interactive_waiting:
                self._abort()
        try:
            yield
        finally:
            with self._cond:
                self._window_open = False
                self._clear_abort()


class Engine:
    def __init__(
        self,
        runtime: RuntimeApi,
        policy: Policy,
        constraints: Constraints,
        sink: Sink,
        metrics: EngineMetrics | None = None,
        seed: int | None = None,
        reserved_interactive: int = 0,
        prefix_cache_tokens: int = 0,
        prefix_cache_slots: int = 0,
        compute_nice: int = 0,
        overlap: bool = False,
    ) -> None:
        """``overlap``: leave each tick in flight until the next step (a GPU computes after
        llama_decode returns); on a CPU, whose llama_decode computes the tick, a step collects
        its own tick: its tokens go out at once and nothing else contends with the compute
        threads (measured: 3% of a lone stream's tokens/s on the 2-core CPU otherwise)."""
        self.runtime = runtime
        self.sink = sink
        self.metrics = metrics or EngineMetrics()
        self.metrics.kv_cells_total = runtime.n_ctx
        self._compute_nice = compute_nice
        self._inbox = Inbox(runtime.abort, runtime.clear_abort)
        sampler = Sampler(runtime)
        self.scheduler = Scheduler(
            runtime,
            policy,
            constraints,
            self.metrics,
            sampler,
            seed=seed,
            reserved_interactive=reserved_interactive,
            prefix_cache_tokens=prefix_cache_tokens,
            prefix_cache_slots=prefix_cache_slots,
        )
        self.executor = Executor(runtime, sampler)
        self._overlap = overlap
        # the tick the device computes, and its items' sequences (the scheduler's launched)
        self._inflight: tuple[Launched, tuple[Sequence, ...]] | None = None
        self._window_t0 = 0.0  # when its launch returned: host work since overlaps it
        self._thread = threading.Thread(target=self._run, name="uma-engine", daemon=True)

    # ---- thread-safe API (called from the I/O thread) ----

    def start(self) -> None:
        self._thread.start()

    def submit(self, sub: Submission) -> None:
        """A chat turn's arrival may cut short a tick of bulk work (see Inbox.abort_window). Its
        prompt's work is what the prefix cache does not hold: a conversation re-sends its
        history, and only the new turn is left to compute."""
        hashes = block_hashes(sub.prompt)
        uncached = len(sub.prompt) - self.scheduler.cached_estimate(hashes)
        chat = prompt_class(sub.request.qos, uncached, self.prompt_allowance()) == INTERACTIVE
        self._inbox.post(msgspec.structs.replace(sub, prompt_hashes=hashes), interactive=chat)

    def cancel(self, key: RequestKey) -> None:
        self._inbox.post(Cancel(key))

    def cancel_connection(self, conn_id: int) -> None:
        self._inbox.post(CancelConnection(conn_id))

    def stop(self, reason: str) -> None:
        """End every request with an eos (reason cancelled, detail ``reason``) and exit."""
        self._inbox.stop(reason)

    def prompt_allowance(self) -> int:
        """Uncached prompt tokens of a chat turn at most, from the current tick-time model."""
        return self.scheduler.prompt_allowance()

    def pin_prefix(self, tokens: list[int], kv_path: str | None) -> str:
        """Keep ``tokens``' KV resident for good (call before start)."""
        return self.scheduler.pin_prefix(tokens, kv_path)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ---- engine thread ----

    def _run(self) -> None:
        lower_current_thread(self._compute_nice)  # llama.cpp's workers, started here, inherit it
        sched = self.scheduler
        try:
            while True:
                ops, stop = self._inbox.take(self._busy, sched.learner.idle)
                events = self._apply(ops)
                if stop is not None:
                    self._settle()
                    self.sink(events + sched.drain(stop))
                    return
                sched.admit()
                events += self._join_arrivals()
                if events:
                    self.sink(events)
                if sched.running or self._inflight is not None:
                    self.step()
                if not sched.running and self._inflight is None:
                    sched.release_ended()  # idle: nothing to overlap it with
        except Exception:
            log.exception("engine thread crashed")
            self._settle()
            self.sink(sched.drain("engine failure", reason="error"))
            raise

    def _busy(self) -> bool:
        return self._inflight is not None or self.scheduler.busy()

    def _join_arrivals(self) -> list[Outgoing]:
        """Requests that arrived while others were admitted join this tick. An admission costs
        the host ~0.4-1 ms (tagging its cached prefix's KV cells), so sixteen requests sent at
        once, sharing a prefix, otherwise started over two or three ticks."""
        events: list[Outgoing] = []
        for _ in range(JOIN_ROUNDS):
            ops = self._inbox.take_ready()
            if not ops:
                break
            events += self._apply(ops)
            self.scheduler.admit()
        return events

    def step(self) -> None:
        """One tick: plan the next one (while the device computes the one in flight, unless
        its drafts need that one's tokens), collect the one in flight and send its events,
        launch the next, let the learner learn the collected one. Without ``overlap`` no tick
        is in flight at a step's start: it plans, launches and collects its own."""
        sched = self.scheduler
        try:
            ahead = self._inflight is not None and sched.plans_ahead
            planned = sched.plan(ahead=True) if ahead and sched.running else None
            done = self._collect()
            if done is not None and done[1].failure is not None:
                planned = None  # planned on a tick that did not happen
            if ahead and self._admit_late():
                planned = None  # requests came while the device computed: they join now
            if planned is None and sched.running:
                planned = sched.plan()
            if planned is not None:
                self._launch(sched.batch(planned))
            if done is not None:
                sched.record(*done)
            if not self._overlap and (done := self._collect()) is not None:
                sched.record(*done)  # nothing to overlap: the tick's tokens at once
        except Exception:  # a bug costs the running requests, not the daemon
            log.exception("tick failed: ending the running requests")
            self._settle()
            self.sink(sched.fail_running("internal error in the engine tick"))

    def _collect(self) -> tuple[Batch, TickResult] | None:
        """The tick in flight: release finished sequences while the device computes, wait for
        it, sample, and send its tokens' events at once."""
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return None
        launched, seqs = inflight
        freed = self.scheduler.release_ended()
        overlap_s = time.perf_counter() - self._window_t0
        result = self.executor.collect(launched, overlap_s, freed > 0)
        events = self.scheduler.advance(launched.batch, seqs, result)
        if events:
            self.sink(events)
        return launched.batch, result

    def _admit_late(self) -> bool:
        """Requests posted since the plan was made, admitted (a plan made ahead would leave
        them for a tick more); whether there were any."""
        ops = self._inbox.take_ready()
        if not ops:
            return False
        events = self._apply(ops)
        self.scheduler.admit()
        events += self._join_arrivals()
        if events:
            self.sink(events)
        return True

    def _launch(self, batch: Batch) -> None:
        if batch.empty:
            return
        with self._inbox.abort_window(batch.abortable):
            launched = self.executor.launch(batch)
        self._inflight = launched, self.scheduler.launched(batch)
        self._window_t0 = time.perf_counter()

    def _settle(self) -> None:
        """Wait for a tick still in flight and drop it (a stop or a failure ends everything)."""
        if self._inflight is not None:
            self._inflight = None
            self.runtime.synchronize()

    def _apply(self, ops: list[Op]) -> list[Outgoing]:
        events: list[Outgoing] = []
        sched = self.scheduler
        for op in ops:
            match op:
                case Submission():
                    sched.add(op)
                case Cancel(key=key):
                    events += sched.cancel(lambda s, k=key: s.key == k, "cancelled by client")
                case CancelConnection(conn_id=conn):
                    events += sched.cancel(lambda s, c=conn: s.conn_id == c, "client disconnected")
        return events
