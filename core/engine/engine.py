"""The engine: a thread that runs ticks, each one llama_decode.

    planned = scheduler.plan()                    # tick N+1's plan, while tick N computes
    out = executor.collect(launched)              # tick N: the device done, its rows sampled
    events = scheduler.advance(batch, seqs, out)  # its tokens: the next ones to decode, ends
    batch = scheduler.batch(planned)              # tick N+1's spans, with tick N's tokens
    launched = executor.launch(batch)             # llama_decode (a GPU computes after it)
    events += scheduler.flush()                   # tick N's tokens -> text, stops, events
    sink(events)                                  # out, while N+1 computes
    seqs = scheduler.launched(batch)              # its sequences where it leaves them
    scheduler.record(...)                         # the learner learns tick N meanwhile

On a GPU a tick stays in flight between two steps: llama_decode returns once the graph is
launched, so the host work of a step (tokens to text and events, the learner, the inbox,
admissions, the next plan, releasing finished sequences' KV) runs while the device computes,
and only sampling, a token's place in its sequence and llama_decode's own host work lie
between two ticks. A stop string found in a token's text ends its sequence after the next
tick was launched with it: that row's result is dropped, as a cancelled sequence's is. A
plan made before the last tick's tokens are known keeps its sequences' places: a sequence
that tick ended drops out of the batch. With speculative drafts the plan waits for the
tokens, which its drafts continue. On a CPU, whose llama_decode computes the tick, a step
launches and collects its own tick (``overlap`` off).

The model may run in several llama.cpp contexts (``Shard``s: each its own sequences, KV
cache, scheduler and tick in flight), stepped in turn: while the device computes one
context's tick, the host collects, plans and launches the other's, llama_decode's own host
work (the batch, the attention mask over the context's cells) included, on the context's
launch thread while another context works. A request goes to a context with room for it, the
one that holds the most of its prompt, then the least busy for a chat turn while no context
holds bulk work (streams spread; for a bigger model once each context it fills holds
``fill`` of them), else the busiest (bulk work joins the streams).

The I/O thread talks to it only through ``submit``/``cancel``/``cancel_connection``/``stop``,
which post to the ``Inbox`` (inbox.py); the engine thread takes everything posted at once
between ticks (and again after admitting, so requests that arrived meanwhile join the tick)
and gets each tick's events to ``sink`` in one call. With no work the thread sleeps on the
inbox's Condition: no polling, no fixed sleeps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import msgspec

from uma_serve.core.engine.executor import Executor
from uma_serve.core.engine.inbox import Cancel, CancelConnection, Inbox, Op
from uma_serve.core.engine.nice import lower_current_thread
from uma_serve.core.engine.scheduler import Scheduler
from uma_serve.core.engine.sequence import RequestKey, Sequence as Seq, Submission
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


class Shard:
    """One llama.cpp context of the model and what runs in it: the scheduler of its
    sequences, the executor of its ticks and the tick it has in flight."""

    def __init__(self, runtime: RuntimeApi, scheduler: Scheduler, executor: Executor) -> None:
        self.runtime = runtime
        self.scheduler = scheduler
        self.executor = executor
        # the tick the device computes, and its items' sequences (the scheduler's launched)
        self.inflight: tuple[Launched, tuple[Seq, ...]] | None = None
        self.window_t0 = 0.0  # when its launch returned: host work since overlaps it

    @property
    def active(self) -> bool:
        return bool(self.scheduler.running) or self.inflight is not None

    def busy(self) -> bool:
        return self.inflight is not None or self.scheduler.busy()

    def settle(self) -> None:
        """Wait for a tick still in flight and drop it (a stop or a failure ends everything)."""
        if self.inflight is not None:
            self.inflight = None
            self.runtime.synchronize()


class Engine:
    def __init__(
        self,
        runtime: RuntimeApi | Sequence[RuntimeApi],
        policy: Policy | Sequence[Policy],
        constraints: Constraints,
        sink: Sink,
        metrics: EngineMetrics | None = None,
        seed: int | None = None,
        reserved_interactive: int = 0,
        prefix_cache_tokens: int = 0,
        prefix_cache_slots: int = 0,
        compute_nice: int = 0,
        overlap: bool = False,
        fill: int = 0,
    ) -> None:
        """``runtime``: one context of the model, or several (one ``policy`` each; the
        prefix cache's tokens and slots are each context's). ``overlap``: leave each tick in
        flight until the next step (a GPU computes after llama_decode returns); on a CPU,
        whose llama_decode computes the tick, a step collects its own tick: its tokens go out
        at once and nothing else contends with the compute threads (measured: 3% of a lone
        stream's tokens/s on the 2-core CPU otherwise). ``fill``: chat turns fill one context
        after another until each holds this many requests, then spread (0: spread from the
        first), while no context holds bulk work."""
        runtimes = list(runtime) if isinstance(runtime, list | tuple) else [runtime]
        policies = list(policy) if isinstance(policy, list | tuple) else [policy]
        assert len(policies) == len(runtimes), "one policy per context"
        self.sink = sink
        self.metrics = metrics or EngineMetrics()
        self.metrics.kv_cells_total = sum(rt.n_ctx for rt in runtimes)
        self._compute_nice = compute_nice
        self._inbox = Inbox()
        self.shards: list[Shard] = []
        for i, (rt, pol) in enumerate(zip(runtimes, policies, strict=True)):
            sampler = Sampler(rt)
            sched = Scheduler(
                rt,
                pol,
                constraints,
                self.metrics,
                sampler,
                seed=None if seed is None else seed + i,
                reserved_interactive=reserved_interactive,
                prefix_cache_tokens=prefix_cache_tokens,
                prefix_cache_slots=prefix_cache_slots,
            )
            self.shards.append(Shard(rt, sched, Executor(rt, sampler)))
        self._overlap = overlap
        self._fill = fill
        self._thread = threading.Thread(target=self._run, name="uma-engine", daemon=True)

    @property
    def scheduler(self) -> Scheduler:
        """The first context's scheduler (its tick-time model sizes a chat turn's prompt)."""
        return self.shards[0].scheduler

    # ---- thread-safe API (called from the I/O thread) ----

    def start(self) -> None:
        self._thread.start()

    def submit(self, sub: Submission) -> None:
        """A chat turn's arrival may cut short a tick of bulk work (see Inbox.abort_window). Its
        prompt's work is what the prefix cache does not hold: a conversation re-sends its
        history, and only the new turn is left to compute."""
        hashes = block_hashes(sub.prompt)
        cached = max(sh.scheduler.cached_estimate(hashes) for sh in self.shards)
        chat = self._chat_turn(sub, cached)
        self._inbox.post(msgspec.structs.replace(sub, prompt_hashes=hashes), interactive=chat)

    def _chat_turn(self, sub: Submission, cached: int) -> bool:
        """Whether the prompt work ``sub`` leaves, ``cached`` tokens of it held, is a chat
        turn's (policy/work.py)."""
        uncached = len(sub.prompt) - cached
        return prompt_class(sub.request.qos, uncached, self.prompt_allowance()) == INTERACTIVE

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
        """Keep ``tokens``' KV resident for good in every context (call before start)."""
        statuses = [sh.scheduler.pin_prefix(tokens, kv_path) for sh in self.shards]
        return statuses[0]  # each context holds its own copy; the first one's status

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ---- engine thread ----

    def _run(self) -> None:
        lower_current_thread(self._compute_nice)  # llama.cpp's workers, started here, inherit it
        try:
            while True:
                ops, stop = self._inbox.take(self._busy, self._idle)
                events = self._apply(ops)
                if stop is not None:
                    for sh in self.shards:
                        sh.settle()
                        events += sh.scheduler.drain(stop)
                    self.sink(events)
                    return
                self._admit()
                events += self._join_arrivals()
                if events:
                    self.sink(events)
                for sh in self.shards:  # in turn: one's host work while another's tick computes
                    if sh.active:
                        self.step(sh)
                for sh in self.shards:
                    if not sh.active:
                        sh.scheduler.release_ended()  # idle: nothing to overlap it with
        except Exception:
            log.exception("engine thread crashed")
            for sh in self.shards:
                sh.settle()
                self.sink(sh.scheduler.drain("engine failure", reason="error"))
            raise

    def _busy(self) -> bool:
        return any(sh.busy() for sh in self.shards)

    def _idle(self) -> None:
        for sh in self.shards:
            sh.scheduler.learner.idle()

    def _admit(self) -> None:
        for sh in self.shards:
            sh.scheduler.admit()

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
            self._admit()
        return events

    def step(self, sh: Shard) -> None:
        """One tick of a context: plan the next one (while the device computes the one in
        flight, unless its drafts need that one's tokens), collect the one in flight and send
        its events, launch the next, let the learner learn the collected one. Without
        ``overlap`` no tick is in flight at a step's start: it plans, launches and collects
        its own."""
        sched = sh.scheduler
        events: list[Outgoing] = []
        try:
            ahead = sh.inflight is not None and sched.plans_ahead
            planned = sched.plan(ahead=True) if ahead and sched.running else None
            done = self._collect(sh, events)
            if done is not None and done[1].failure is not None:
                planned = None  # planned on a tick that did not happen
            if ahead and self._admit_late(events):
                planned = None  # requests came while the device computed: they join now
            if planned is None and sched.running:
                planned = sched.plan()
            if planned is not None:
                self._launch(sh, sched.batch(planned))
            # the tick's tokens become text and events, and go out, once the next tick is
            # launched: the I/O thread that writes them takes the GIL whenever this thread
            # lets it go, and its writes then overlap the device instead of holding up the launch
            events += sched.flush()
            self._send(events)
            if done is not None:
                sched.record(*done)
            if not self._overlap and (done := self._collect(sh, events)) is not None:
                events += sched.flush()
                self._send(events)  # nothing to overlap: the tick's tokens at once
                sched.record(*done)
        except Exception:  # a bug costs the running requests, not the daemon
            log.exception("tick failed: ending the running requests")
            sh.settle()
            self._send(events)
            self.sink(sched.fail_running("internal error in the engine tick"))

    def _send(self, events: list[Outgoing]) -> None:
        if events:
            self.sink(events[:])
            events.clear()

    def _collect(self, sh: Shard, events: list[Outgoing]) -> tuple[Batch, TickResult] | None:
        """The tick in flight: release finished sequences while the device computes, wait for
        it, sample; its tokens' events are added to ``events`` (sent at once if one is a
        request's first token)."""
        inflight, sh.inflight = sh.inflight, None
        if inflight is None:
            return None
        launched, seqs = inflight
        freed = sh.scheduler.release_ended()
        overlap_s = time.perf_counter() - sh.window_t0
        result = sh.executor.collect(launched, overlap_s, freed > 0)
        events += sh.scheduler.advance(launched.batch, seqs, result)
        if any(seq.generated == 1 for seq in seqs):
            # a first token goes at once: the launch after a prompt's tick may build a new
            # CUDA graph (TTFT through the gateway 12-13 ms against 8-10 ms, H100)
            self._send(events)
        return launched.batch, result

    def _admit_late(self, events: list[Outgoing]) -> bool:
        """Requests posted since the plan was made, admitted (a plan made ahead would leave
        them for a tick more), their events after ``events``; whether there were any."""
        ops = self._inbox.take_ready()
        if not ops:
            return False
        events += self._apply(ops)
        self._admit()
        events += self._join_arrivals()
        return True

    def _launch(self, sh: Shard, batch: Batch) -> None:
        if batch.empty:
            return
        # another context's tick to work for meanwhile: this one's llama_decode goes to its
        # launch thread (a lone context's launch stays here: the handoff costs ~0.1 ms a tick)
        others = any(s.active for s in self.shards if s is not sh)
        with self._inbox.abort_window(batch.abortable, sh.runtime):
            launched = sh.executor.launch(batch, on_thread=others)
        sh.inflight = launched, sh.scheduler.launched(batch)
        sh.window_t0 = time.perf_counter()

    def _route(self, sub: Submission) -> Scheduler:
        """The context for a new request: one with room for it, then the one holding the most
        of its prompt (a conversation's history), then for a chat turn while no context holds
        bulk work the busiest context under ``fill`` requests, else the least busy (the
        streams spread: one context's host work overlaps another's tick; a bigger model fills
        a context first, as splitting a small batch runs its matmuls twice), else the busiest.
        Bulk work (a pasted document) so joins the streams of a context, whose policy budgets
        them together, and a chat turn joins the bulk work: a context whose policy saw no
        stream would run unbounded prefill ticks, and every gap of a stream in another
        context includes them."""
        if len(self.shards) == 1:
            return self.scheduler
        scheds = [sh.scheduler for sh in self.shards]
        cached = [s.cached_estimate(sub.prompt_hashes) for s in scheds]
        chat = self._chat_turn(sub, max(cached))
        spread = chat and not any(s.holds_bulk() for s in scheds)

        def busy(s: Scheduler) -> tuple[bool, int]:
            load = s.load()
            if not spread:
                return True, load  # the busiest
            return (True, load) if load < self._fill else (False, -load)

        ranks = [(s.has_room(sub, c), c, busy(s)) for s, c in zip(scheds, cached, strict=True)]
        return scheds[ranks.index(max(ranks))]

    def _apply(self, ops: list[Op]) -> list[Outgoing]:
        events: list[Outgoing] = []
        for op in ops:
            match op:
                case Submission():
                    self._route(op).add(op)
                case Cancel(key=key):
                    for sh in self.shards:
                        events += sh.scheduler.cancel(
                            lambda s, k=key: s.key == k, "cancelled by client"
                        )
                case CancelConnection(conn_id=conn):
                    for sh in self.shards:
                        events += sh.scheduler.cancel(
                            lambda s, c=conn: s.conn_id == c, "client disconnected"
                        )
        return events
