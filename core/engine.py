"""The engine: a thread that runs ticks. Each tick executes one Plan with one llama_decode.

    drain inbox -> plan = policy(snapshot) -> decode -> sample + detokenize -> hand off events

The I/O thread talks to it only through ``submit``/``cancel``/``cancel_connection``/``stop``
(an inbox under a Condition) and receives each tick's events through ``sink`` in one call.
When there is no work the thread sleeps on the Condition: no polling, no fixed sleeps.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from uma_serve.core import protocol as p
from uma_serve.core.metrics import EngineMetrics
from uma_serve.core.policy import (
    Constraints,
    IBatchPolicy,
    Phase,
    Plan,
    SchedulerState,
)
from uma_serve.core.policy.prefix import PrefixIndex
from uma_serve.core.policy.spec import NgramIndex
from uma_serve.core.policy.tuner import SweetSpotTuner
from uma_serve.core.prefix_store import PrefixStore
from uma_serve.core.runtime import Runtime, Span
from uma_serve.core.samplers import Samplers
from uma_serve.core.sequence import RequestKey, Sequence
from uma_serve.core.tick_learner import TickLearner

log = logging.getLogger("uma.engine")

Outgoing = tuple[int, p.Event]  # (connection id, event)
ABORTED = 2  # llama_decode's rc when Runtime.abort stopped it
Sink = Callable[[list[Outgoing]], None]


@dataclass(frozen=True)
class Submission:
    key: RequestKey
    request: p.Generate
    prompt: list[int]
    arrival_ns: int


class Engine:
    def __init__(
        self,
        runtime: Runtime,
        policy: IBatchPolicy,
        constraints: Constraints,
        sink: Sink,
        metrics: EngineMetrics | None = None,
        seed: int | None = None,
        tuner: SweetSpotTuner | None = None,
        reserved_interactive: int = 0,
        sampler: str = "numpy",
        prefix_cache_tokens: int = 0,
        overlap: bool = False,
    ) -> None:
        self.runtime = runtime
        # hand a tick's events to the I/O thread only once the next tick is launched: a GPU
        # decode returns before the device finishes, and the I/O thread's encoding then runs
        # while this thread waits on the device (GIL released) instead of beside the planning
        self._overlap = overlap
        self.policy = policy
        self.constraints = constraints
        self.sink = sink
        self.metrics = metrics or EngineMetrics()
        self.metrics.kv_cells_total = runtime.n_ctx
        self._rng = random.Random(seed)
        self._cond = threading.Condition()
        self._inbox: deque[tuple[str, object]] = deque()
        self._stop_reason: str | None = None
        self._free_seq_ids = list(range(runtime.params.n_seq))
        n_seq, n_cache = runtime.params.n_seq, runtime.params.n_seq_cache
        self._prefix = (
            PrefixStore(
                runtime,
                PrefixIndex(range(n_seq, n_seq + n_cache), prefix_cache_tokens),
                self.metrics,
                constraints.n_batch,
            )
            if prefix_cache_tokens > 0 and n_cache > 0
            else None
        )
        self._spec = constraints.spec_max_draft
        self._waiting: deque[Sequence] = deque()
        self._running: dict[int, Sequence] = {}  # seq_id -> sequence
        self._learner = TickLearner(constraints, tuner)
        self._reserved = reserved_interactive  # sequences only interactive requests may take
        self._samplers = Samplers(runtime, sampler)
        self.metrics.bmt_budget = (constraints.bmt_budget_gbs or 0.0) * 1e9
        self._max_prefill: int | None = None
        self._out: list[Outgoing] = []
        # an interactive arrival aborts a running tick that no interactive request waits on
        # (only with quiet_ms: those are the long ticks); both read and written under _cond
        self._abortable = False
        self._last_interactive_ns = 0
        self._thread = threading.Thread(target=self._run, name="uma-engine", daemon=True)

    # ---- thread-safe API (called from the I/O thread) ----

    def start(self) -> None:
        self._thread.start()

    def submit(self, sub: Submission) -> None:
        with self._cond:
            self._inbox.append(("submit", sub))
            if self._abortable and sub.request.qos == "interactive":
                self.runtime.abort()
            self._cond.notify()

    def cancel(self, key: RequestKey) -> None:
        self._post("cancel", key)

    def cancel_connection(self, conn_id: int) -> None:
        self._post("cancel_conn", conn_id)

    def stop(self, reason: str) -> None:
        """End every request with an eos (reason cancelled, detail ``reason``) and exit."""
        with self._cond:
            self._stop_reason = reason
            self._cond.notify()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _post(self, op: str, arg: object) -> None:
        with self._cond:
            self._inbox.append((op, arg))
            self._cond.notify()

    # ---- engine thread ----

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not (
                        self._inbox or self._running or self._stop_reason or self._admittable()
                    ):
                        self._learner.idle()  # idle time is not tick overhead
                        self._cond.wait()
                    ops = list(self._inbox)
                    self._inbox.clear()
                    stop = self._stop_reason
                self._apply(ops)
                if stop is not None:
                    self._drain(stop)
                    return
                self._admit()
                if self._running:
                    try:
                        self.step()
                    except Exception:  # a bug costs the running requests, not the daemon
                        log.exception("tick failed: ending the running requests")
                        self._fail_running("internal error in the engine tick")
                if not (self._overlap and self._running):  # else the next tick flushes
                    self._flush()
        except Exception:
            log.exception("engine thread crashed")
            self._drain("engine failure", reason="error")
            raise

    def _fail_running(self, message: str) -> None:
        now = time.monotonic_ns()
        for seq in list(self._running.values()):
            self._fail(seq, p.E_RUNTIME, message, now)

    def _apply(self, ops: list[tuple[str, object]]) -> None:
        for op, arg in ops:
            if op == "submit":
                assert isinstance(arg, Submission)
                self._waiting.append(Sequence(arg.key, arg.request, arg.prompt, arg.arrival_ns))
            elif op == "cancel":
                self._cancel(lambda s, key=arg: s.key == key, "cancelled by client")
            elif op == "cancel_conn":
                self._cancel(lambda s, c=arg: s.conn_id == c, "client disconnected")
        self.metrics.waiting_sessions = len(self._waiting)

    def _cancel(self, match: Callable[[Sequence], bool], detail: str) -> None:
        """Idempotent: a request already finished or unknown is ignored."""
        now = time.monotonic_ns()
        for seq in [s for s in self._waiting if match(s)]:
            self._waiting.remove(seq)
            self._finish(seq, "cancelled", now, detail)
        for seq in [s for s in self._running.values() if match(s)]:
            self._finish(seq, "cancelled", now, detail)

    def _next_admission(self) -> Sequence | None:
        """Interactive requests first (FIFO); background ones only beyond the reserved seqs."""
        first_bg = None
        for seq in self._waiting:
            if seq.request.qos == "interactive":
                return seq
            first_bg = first_bg or seq
        return first_bg if len(self._free_seq_ids) > self._reserved else None

    def _admittable(self) -> bool:
        """A waiting request could take a free sequence now (e.g. after a tick that ended every
        running request at once)."""
        return bool(self._waiting and self._free_seq_ids) and self._next_admission() is not None

    def _admit(self) -> None:
        now = time.monotonic_ns()
        while self._waiting and self._free_seq_ids:
            seq = self._next_admission()
            if seq is None:
                break
            self._waiting.remove(seq)
            seq.seq_id = self._free_seq_ids.pop()
            seq.admitted_ns = seq.last_progress_ns = now
            seq.sampler = self._samplers.new(seq.seq_id, seq.request, self._rng.getrandbits(32))
            self.runtime.seq_clear(seq.seq_id)
            if self._prefix is not None:
                self._prefix.reuse(seq)
            if self._spec > 0:
                seq.ngrams = NgramIndex(seq.prompt)
            self._running[seq.seq_id] = seq
            self.metrics.queue_ms.observe((now - seq.arrival_ns) * 1e-6)
        self.metrics.waiting_sessions = len(self._waiting)
        self.metrics.active_sessions = len(self._running)

    def pin_prefix(self, tokens: list[int], kv_path: str | None) -> str:
        """Keep ``tokens``' KV resident for good (call before start): see PrefixStore.pin."""
        return self._prefix.pin(tokens, kv_path) if self._prefix is not None else "off"

    def _propose_drafts(self) -> None:
        """Prompt-lookup proposals for the decoding sequences (only while few decode)."""
        decoding = [s for s in self._running.values() if s.next_token is not None]
        few = len(decoding) <= self.constraints.spec_max_streams
        for s in decoding:
            s.draft = ()
            if few and s.ngrams is not None:
                limit = min(
                    self._spec,
                    s.request.max_tokens - s.generated - 1,
                    self.runtime.n_ctx_per_seq - s.n_past - 2,
                )
                s.draft = s.ngrams.draft(limit)

    def snapshot(self) -> SchedulerState:
        if self._spec > 0:
            self._propose_drafts()
        views = tuple(s.view() for s in self._running.values())
        now = time.monotonic_ns()
        if any(v.qos == "interactive" for v in views) or any(
            s.request.qos == "interactive" for s in self._waiting
        ):
            self._last_interactive_ns = now
        return SchedulerState(views, self._learner.stats, now, self._last_interactive_ns)

    def step(self) -> None:
        """One tick: plan, decode, sample."""
        constraints = replace(self.constraints, max_prefill_tokens=self._max_prefill)
        state = self.snapshot()
        plan = self.policy.schedule_tick(state, constraints)
        if plan.empty:
            self._flush()
            return
        spans = [
            self._span(item.seq_id, item.phase, item.n_tokens, item.logits) for item in plan.items
        ]
        t0 = time.perf_counter()
        self._learner.tick_started(t0)
        abortable = self.constraints.quiet_ms > 0 and not self._serves_interactive()
        if abortable:
            self._set_abortable(True)
        rc, rows = self.runtime.decode(spans)
        if abortable:
            self._set_abortable(False)
        if self._overlap:
            self._flush()  # the previous tick's events, while the device computes this one
        ms = (time.perf_counter() - t0) * 1e3
        self._learner.tick_decoded(t0, ms)
        if rc == ABORTED:  # an interactive request arrived: it is admitted next tick
            for span in spans:
                self.runtime.seq_trim(span.seq_id, span.pos)
            self.metrics.ticks_aborted_total += 1
            self._learner.idle()  # the aborted tick's time teaches nothing
            return
        if rc != 0:
            self._decode_failed(rc, plan, spans)
            return
        self._record_tick(ms, plan, state)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "tick %d: decode %d prefill %d parked %d | %.1f ms (predicted %.1f, budget %s)",
                self._learner.stats.tick,
                plan.n_decode,
                plan.n_tokens - plan.n_decode,
                len(plan.parked),
                ms,
                plan.predicted_ms or 0.0,
                f"{plan.budget_ms:.1f}" if plan.budget_ms is not None else "-",
            )
        now = time.monotonic_ns()
        served = {item.seq_id for item in plan.items}
        for seq in self._running.values():
            if seq.seq_id not in served:
                seq.burst = 0
        for item, span, row in zip(plan.items, spans, rows, strict=True):
            seq = self._running[item.seq_id]
            seq.last_progress_ns = now
            seq.burst = seq.burst + 1 if item.phase is Phase.DECODE else 0
            if item.phase is Phase.DECODE and len(span.tokens) > 1:
                self._verify(seq, span.tokens[1:], row, now)
                continue
            seq.n_past += len(span.tokens)
            if item.phase is Phase.DECODE:
                seq.next_token = None
            elif not seq.pending_prefill:
                seq.prefill_done_ns = now
            if row >= 0:
                self._on_logits(seq, row, now)
        self.metrics.kv_cells_used = sum(s.n_past for s in self._running.values())

    def _serves_interactive(self) -> bool:
        return any(s.request.qos == "interactive" for s in self._running.values())

    def _set_abortable(self, on: bool) -> None:
        """Open (or close) the window in which an interactive arrival aborts the decode; one
        already in the inbox aborts it at once."""
        with self._cond:
            self._abortable = on
            if on and any(
                op == "submit" and arg.request.qos == "interactive"  # type: ignore[attr-defined]
                for op, arg in self._inbox
            ):
                self.runtime.abort()
            elif not on:
                self.runtime.clear_abort()

    def _span(self, seq_id: int, phase: Phase, n: int, logits: bool) -> Span:
        seq = self._running[seq_id]
        if phase is Phase.DECODE:
            assert seq.next_token is not None
            tokens = [seq.next_token, *seq.draft[: n - 1]]
            return Span(seq_id, seq.n_past, tokens, True, all_logits=len(tokens) > 1)
        tokens = seq.prompt[seq.n_past : seq.n_past + n]
        return Span(seq_id, seq.n_past, tokens, logits and seq.n_past + n == len(seq.prompt))

    def _verify(self, seq: Sequence, drafts: list[int], row: int, now: int) -> None:
        """Speculative verification of [pending token, *drafts] decoded with logits on every row.

        Row j holds the distribution after the pending token and drafts[:j]. Sample it with the
        session's own sampler and emit the token through the usual path; while it equals
        drafts[j], that token is already in the KV at the next position, so row j + 1 is valid
        and is sampled next. The first disagreement (or the row after the last draft) yields
        the new pending token; the KV beyond the accepted run is removed. Every emitted token is
        the one plain decoding would sample from the same logits: greedy output is identical,
        sampled output has the same law.
        """
        seq.n_past += 1  # the pending token
        seq.next_token = None
        accepted = 0
        for j in range(len(drafts) + 1):
            self._on_logits(seq, row + j, now)
            if seq.next_token is None:  # finished (EOS, stop string, length)
                break
            if j == len(drafts) or seq.next_token != drafts[j]:
                break
            seq.n_past += 1
            accepted += 1
            seq.next_token = None
        if self._running.get(seq.seq_id) is seq:
            self.runtime.seq_trim(seq.seq_id, seq.n_past)
        m = self.metrics
        m.spec_drafted_tokens_total += len(drafts)
        m.spec_accepted_tokens_total += accepted
        # per-token acceptance: accepted tokens over accepted + the one rejection (if any)
        sample = accepted / (accepted + (accepted < len(drafts)))
        seq.spec_accept_ewma = 0.3 * sample + 0.7 * seq.spec_accept_ewma

    def _record_tick(self, ms: float, plan: Plan, state: SchedulerState) -> None:
        self._learner.record(ms, plan, state, self.metrics)
        if self._max_prefill is not None:  # recover gradually after a failed decode
            self._max_prefill *= 2
            if self._max_prefill >= self.constraints.n_batch:
                self._max_prefill = None

    def _decode_failed(self, rc: int, plan: Plan, spans: list[Span]) -> None:
        self.metrics.decode_failures_total += 1
        for span in spans:  # undo whatever part of the batch reached the cache
            self.runtime.seq_trim(span.seq_id, span.pos)
        self._learner.decode_failed()
        if rc == 1 and self._prefix is not None and self._prefix.evict_all():
            log.warning("no KV slot for %d tokens: evicted the prefix cache", plan.n_tokens)
            return
        n_prefill = sum(i.n_tokens for i in plan.items if i.phase is Phase.PREFILL)
        now = time.monotonic_ns()
        if rc == 1 and n_prefill > 1:
            self._max_prefill = max(n_prefill // 2, 1)
            log.warning(
                "no KV slot for %d tokens: shrinking prefill to %d",
                plan.n_tokens,
                self._max_prefill,
            )
            return
        if rc == 1:  # decode alone does not fit: the longest sequence gives way
            victim = max(self._running.values(), key=lambda s: s.n_past)
            self._fail(victim, p.E_RUNTIME, "KV cache full: no slot for this sequence", now)
            return
        log.error("llama_decode returned %d: failing the batch's requests", rc)
        for item in plan.items:
            seq = self._running.get(item.seq_id)
            if seq is not None:
                self._fail(seq, p.E_RUNTIME, f"llama_decode failed (rc={rc})", now)

    def _on_logits(self, seq: Sequence, row: int, now: int) -> None:
        token = self._samplers.sample(seq.seq_id, seq.sampler, row)
        req = seq.request
        if self.runtime.is_eog(token) and not req.ignore_eos:
            self._finish(seq, "stop", now, token=token)
            return
        seq.generated += 1
        self.metrics.tokens_generated_total += 1
        if seq.first_token_ns is None:
            seq.first_token_ns = now
            self.metrics.observe_ttft(req.qos, (now - seq.arrival_ns) * 1e-6)
        else:
            self.metrics.observe_itl(req.qos, (now - (seq.last_token_ns or now)) * 1e-6)
        seq.last_token_ns = now
        text = seq.text.push(self.runtime.piece(token))
        if seq.text.stopped:
            self._emit_text(seq, text, token)
            self._finish(seq, "stop", now)
        elif seq.generated >= req.max_tokens or seq.n_past + 1 >= self.runtime.n_ctx_per_seq:
            self._emit_text(seq, text + seq.text.flush(), token)
            self._finish(seq, "length", now)
        else:
            self._emit_text(seq, text, token)
            seq.next_token = token
            seq.out.append(token)
            if seq.ngrams is not None:
                seq.ngrams.append(token)

    def _emit_text(self, seq: Sequence, text: str, token: int) -> None:
        event = seq.token_event(text, token)
        if event is not None:
            self._out.append((seq.conn_id, event))

    def _fail(self, seq: Sequence, code: str, message: str, now: int) -> None:
        self._out.append((seq.conn_id, p.ErrorEvent(id=seq.request.id, code=code, message=message)))
        self._finish(seq, "error", now, message, send=False)

    def _finish(
        self,
        seq: Sequence,
        reason: str,
        now: int,
        detail: str | None = None,
        token: int = -1,
        send: bool = True,
    ) -> None:
        if reason == "stop":
            rest = seq.text.flush()
            if rest:
                self._emit_text(seq, rest, token)
        if seq.seq_id >= 0 and self._running.pop(seq.seq_id, None) is seq:
            if self._prefix is not None and reason != "error" and seq.n_past > 0:
                self._prefix.store(seq)
            self.runtime.seq_clear(seq.seq_id)
            self._free_seq_ids.append(seq.seq_id)
        self._samplers.release(seq.seq_id, seq.sampler)
        self.metrics.requests_total[reason] += 1
        self.metrics.e2e_ms.observe((now - seq.arrival_ns) * 1e-6)
        self.metrics.active_sessions = len(self._running)
        self.metrics.kv_cells_used = sum(s.n_past for s in self._running.values())
        if send:
            self._out.append((seq.conn_id, seq.final_event(reason, now, detail)))

    def _flush(self) -> None:
        if self._out:
            out, self._out = self._out, []
            self.sink(out)

    def _drain(self, detail: str, reason: str = "cancelled") -> None:
        now = time.monotonic_ns()
        for seq in list(self._waiting) + list(self._running.values()):
            self._finish(seq, reason, now, detail)
        self._waiting.clear()
        self.metrics.waiting_sessions = 0
        self._flush()
