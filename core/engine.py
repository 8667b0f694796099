"""The engine: a thread that runs ticks. Each tick executes one Plan with one llama_decode.

    drain inbox -> plan = policy(snapshot) -> decode -> sample + detokenize -> hand off events

The I/O thread talks to it only through ``submit``/``cancel``/``cancel_connection``/``stop``
(an inbox under a Condition) and gets each tick's events through ``sink`` in one call. With
no work the thread sleeps on the Condition: no polling, no fixed sleeps.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from uma_serve.core import protocol as p
from uma_serve.core.admission import AdmissionQueue
from uma_serve.core.faults import DECODE_FAIL_RC
from uma_serve.core.inbox import Inbox, Submission
from uma_serve.core.metrics import EngineMetrics
from uma_serve.core.policy import BatchItem, Constraints, IBatchPolicy, Phase, Plan, SchedulerState
from uma_serve.core.policy.spec import NgramIndex
from uma_serve.core.policy.tuner import SweetSpotTuner
from uma_serve.core.policy.work import BACKGROUND, INTERACTIVE, prompt_allowance, prompt_class
from uma_serve.core.prefix_store import PrefixStore
from uma_serve.core.priority import lower_current_thread
from uma_serve.core.runtime import Runtime, Span
from uma_serve.core.samplers import Samplers
from uma_serve.core.sequence import RequestKey, Sequence
from uma_serve.core.speculation import WorkloadAcceptance, propose_drafts, verify
from uma_serve.core.tick_learner import TickLearner

log = logging.getLogger("uma.engine")

Outgoing = tuple[int, p.Event]  # (connection id, event)
ABORTED = 2  # llama_decode's rc when Runtime.abort stopped it
Sink = Callable[[list[Outgoing]], None]


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
        compute_nice: int = 0,
        fail_decode: str | None = None,
    ) -> None:
        self.runtime = runtime
        self._fail_decode = fail_decode  # fault injection (core/faults.py), None in service
        # hand a tick's events over once the next tick is launched (encoding while the device
        # works); off by default: no gain measured, and tokens wait a launch (docs/CONFIG.md)
        self._overlap = overlap
        self._compute_nice = compute_nice
        self.policy = policy
        self.constraints = constraints
        self.sink = sink
        self.metrics = metrics or EngineMetrics()
        self.metrics.kv_cells_total = runtime.n_ctx
        self._rng = random.Random(seed)
        self._inbox = Inbox(runtime.abort, runtime.clear_abort)
        self._queue = AdmissionQueue(range(runtime.params.n_seq), reserved_interactive)
        self._prefix = PrefixStore.build(runtime, self.metrics, constraints, prefix_cache_tokens)
        self._spec = constraints.spec_max_draft
        self._accept = WorkloadAcceptance()  # a new session's draft acceptance estimate
        self._running: dict[int, Sequence] = {}  # seq_id -> sequence
        self._learner = TickLearner(constraints, tuner)
        self._samplers = Samplers(runtime, sampler)
        self.metrics.bmt_budget = (constraints.bmt_budget_gbs or 0.0) * 1e9
        self._max_prefill: int | None = None
        self._out: list[Outgoing] = []
        self._ended: list[tuple[Sequence, str]] = []  # finished, KV not yet released
        self._last_interactive_ns = 0  # when an interactive request last ran or waited
        self._thread = threading.Thread(target=self._run, name="uma-engine", daemon=True)

    # ---- thread-safe API (called from the I/O thread) ----

    def start(self) -> None:
        self._thread.start()

    def submit(self, sub: Submission) -> None:
        """A chat turn's arrival may cut short a tick of bulk work (``step``)."""
        label = sub.request.qos
        chat = prompt_class(label, len(sub.prompt), self.prompt_allowance()) == INTERACTIVE
        self._inbox.post("submit", sub, interactive=chat)

    def cancel(self, key: RequestKey) -> None:
        self._inbox.post("cancel", key)

    def cancel_connection(self, conn_id: int) -> None:
        self._inbox.post("cancel_conn", conn_id)

    def stop(self, reason: str) -> None:
        """End every request with an eos (reason cancelled, detail ``reason``) and exit."""
        self._inbox.stop(reason)

    def prompt_allowance(self) -> int:
        """Uncached prompt tokens of a chat turn at most, from the current tick-time model."""
        return prompt_allowance(self._learner.stats.cost, self.constraints)

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
                ops, stop = self._inbox.take(self._busy, self._learner.idle)
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
                        now = time.monotonic_ns()
                        for seq in list(self._running.values()):
                            self._fail(seq, p.E_RUNTIME, "internal error in the engine tick", now)
                if not self._running:
                    self._release_ended()  # idle: nothing to overlap it with
                if not (self._overlap and self._running):  # else the next tick flushes
                    self._flush()
        except Exception:
            log.exception("engine thread crashed")
            self._drain("engine failure", reason="error")
            raise

    def _apply(self, ops: list[tuple[str, object]]) -> None:
        for op, arg in ops:
            if op == "submit":
                assert isinstance(arg, Submission)
                seq = Sequence(arg.key, arg.request, arg.prompt, arg.arrival_ns)
                seq.bulk_prompt = len(seq.prompt) > self.prompt_allowance()
                self._queue.waiting.append(seq)
            elif op == "cancel":
                self._cancel(lambda s, key=arg: s.key == key, "cancelled by client")
            elif op == "cancel_conn":
                self._cancel(lambda s, c=arg: s.conn_id == c, "client disconnected")
        self.metrics.waiting_sessions = len(self._queue)

    def _cancel(self, match: Callable[[Sequence], bool], detail: str) -> None:
        """Idempotent: a request already finished or unknown is ignored."""
        now = time.monotonic_ns()
        for seq in self._queue.remove(match):
            self._finish(seq, "cancelled", now, detail)
        for seq in [s for s in self._running.values() if match(s)]:
            self._finish(seq, "cancelled", now, detail)

    def _busy(self) -> bool:
        """Work without new input: running requests, or one that can take a free sequence
        (idle time between is not tick overhead)."""
        return bool(self._running) or self._queue.admittable(self._hold())

    def _hold(self) -> Callable[[Sequence], bool] | None:  # waiting for a leader's prefix
        return self._prefix.holder(self._running.values()) if self._prefix else None

    def _admit(self) -> None:
        if self._ended and len(self._queue):  # a waiting request may need their ids or KV
            self._release_ended()
        now = time.monotonic_ns()
        while (seq := self._queue.admit(self._hold())) is not None:
            seq.admitted_ns = seq.last_progress_ns = now
            seq.sampler = self._samplers.new(seq.seq_id, seq.request, self._rng.getrandbits(32))
            self.runtime.seq_clear(seq.seq_id)
            if self._prefix is not None:
                self._prefix.reuse(seq, self._running.values())
            seq.bulk_prompt = seq.pending_prefill > self.prompt_allowance()
            if self._spec > 0:
                seq.ngrams = NgramIndex(seq.prompt)
                seq.spec_accept_ewma = self._accept.value
            self._running[seq.seq_id] = seq
            self.metrics.queue_ms.observe((now - seq.arrival_ns) * 1e-6)
        self.metrics.waiting_sessions = len(self._queue)
        self.metrics.active_sessions = len(self._running)

    def pin_prefix(self, tokens: list[int], kv_path: str | None) -> str:
        """Keep ``tokens``' KV resident for good (call before start): see PrefixStore.pin."""
        return self._prefix.pin(tokens, kv_path) if self._prefix is not None else "off"

    def snapshot(self) -> SchedulerState:
        if self._spec > 0:
            decoding = [s for s in self._running.values() if s.next_token is not None]
            c = self.constraints
            propose_drafts(decoding, self._spec, c.spec_max_streams, self.runtime.n_ctx_per_seq)
        views = tuple(s.view() for s in self._running.values())
        now = time.monotonic_ns()
        if any(s.interactive for s in self._running.values()) or self._queue.has_interactive():
            self._last_interactive_ns = now  # a conversation is going on
        return SchedulerState(views, self._learner.stats, now, self._last_interactive_ns)

    def step(self) -> None:
        """One tick: plan, decode, sample."""
        constraints = replace(self.constraints, max_prefill_tokens=self._max_prefill)
        state = self.snapshot()
        plan = self.policy.schedule_tick(state, constraints)
        views = {v.seq_id: v for v in state.sessions}
        if plan.empty:
            self._flush()
            return
        spans = [self._span(item) for item in plan.items]
        t0 = time.perf_counter()
        self._learner.tick_started(t0)
        # a tick of bulk work only: a chat turn's arrival stops it (its chunk is redone later)
        abortable = all(views[i.seq_id].qos != INTERACTIVE for i in plan.items)
        if abortable:
            self._inbox.open_abort_window()
        rc, rows = self.runtime.decode(spans)
        if self._fail_decode is not None and rc == 0 and self._faulty(plan):
            rc = DECODE_FAIL_RC
        if abortable:
            self._inbox.close_abort_window()
        released_s = self._release_ended()  # on a GPU the decode is still running
        if self._overlap:
            self._flush()  # the previous tick's events, while the device computes this one
        self.runtime.synchronize()  # the tick's time includes the device's work
        ms = (time.perf_counter() - t0 - released_s) * 1e3  # the tick's own time
        self._learner.tick_decoded(t0, ms)
        if rc != 0:
            self._decode_failed(rc, plan, spans, freed=released_s > 0)
            return
        self._record_tick(ms, plan, state)
        now = time.monotonic_ns()
        served = {item.seq_id for item in plan.items}
        for seq in self._running.values():
            if seq.seq_id not in served:
                seq.burst = 0
        plain: list[tuple[Sequence, int]] = []  # a row each, sampled together
        drafted: list[tuple[Sequence, list[int], int]] = []  # rows verified one by one
        for item, span, row in zip(plan.items, spans, rows, strict=True):
            seq = self._running[item.seq_id]
            seq.last_progress_ns = now
            seq.burst = seq.burst + 1 if item.phase is Phase.DECODE else 0
            if item.phase is Phase.DECODE and len(span.tokens) > 1:
                drafted.append((seq, span.tokens[1:], row))
                continue
            seq.n_past += len(span.tokens)
            if item.phase is Phase.DECODE:
                seq.next_token = None
            elif not seq.pending_prefill:
                seq.prefill_done_ns = now
            if row >= 0:
                plain.append((seq, row))
        picks = self._samplers.sample_rows(
            [(seq.seq_id, seq.sampler, row, seq.request.logprobs) for seq, row in plain]
        )
        for (seq, _), (token, lp) in zip(plain, picks, strict=True):
            self._on_token(seq, token, lp, now)
        for seq, drafts, row in drafted:
            self._verify(seq, drafts, row, now)
        self.metrics.kv_cells_used = sum(s.n_past for s in self._running.values())

    def _faulty(self, plan: Plan) -> bool:
        marker = self._fail_decode or ""
        return any(marker in (self._running[i.seq_id].request.prompt or "") for i in plan.items)

    def _span(self, item: BatchItem) -> Span:
        seq, n = self._running[item.seq_id], item.n_tokens
        if item.phase is Phase.DECODE:
            assert seq.next_token is not None
            tokens = [seq.next_token, *seq.draft[: n - 1]]
            return Span(seq.seq_id, seq.n_past, tokens, True, all_logits=len(tokens) > 1)
        last = item.logits and seq.n_past + n == len(seq.prompt)
        return Span(seq.seq_id, seq.n_past, seq.prompt[seq.n_past : seq.n_past + n], last)

    def _verify(self, seq: Sequence, drafts: list[int], row: int, now: int) -> None:
        accepted = verify(seq, drafts, row, lambda r: self._on_logits(seq, r, now), self._accept)
        if self._running.get(seq.seq_id) is seq:  # the KV beyond the accepted run goes
            self.runtime.seq_trim(seq.seq_id, seq.n_past)
        self.metrics.spec_drafted_tokens_total += len(drafts)
        self.metrics.spec_accepted_tokens_total += accepted

    def _record_tick(self, ms: float, plan: Plan, state: SchedulerState) -> None:
        self._learner.record(ms, plan, state, self.metrics)
        if self._max_prefill is not None:  # recover gradually after a failed decode
            doubled = self._max_prefill * 2
            self._max_prefill = doubled if doubled < self.constraints.n_batch else None

    def _decode_failed(self, rc: int, plan: Plan, spans: list[Span], freed: bool) -> None:
        for span in spans:  # undo whatever part of the batch reached the cache
            self.runtime.seq_trim(span.seq_id, span.pos)
        if rc == ABORTED:  # an interactive request arrived: it is admitted next tick
            self.metrics.ticks_aborted_total += 1
            self._learner.idle()  # the aborted tick's time teaches nothing
            return
        self.metrics.decode_failures_total += 1
        if rc == 1 and freed:  # finished sequences' KV was freed after it: the tick is retried
            self._learner.idle()
            return
        self._learner.decode_failed()
        if rc == 1 and self._prefix is not None and self._prefix.evict_all():
            log.warning("no KV slot for %d tokens: evicted the prefix cache", plan.n_tokens)
            return
        n_prefill = sum(i.n_tokens for i in plan.items if i.phase is Phase.PREFILL)
        now = time.monotonic_ns()
        if rc == 1 and n_prefill > 1:
            self._max_prefill = half = max(n_prefill // 2, 1)
            log.warning("no KV slot for %d tokens: shrinking prefill to %d", plan.n_tokens, half)
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
        token, lp = self._samplers.sample_logprobs(
            seq.seq_id, seq.sampler, row, seq.request.logprobs
        )
        self._on_token(seq, token, lp, now)

    def _on_token(self, seq: Sequence, token: int, lp: p.Logprobs | None, now: int) -> None:
        req = seq.request
        if self.runtime.is_eog(token) and not req.ignore_eos:
            self._finish(seq, "stop", now, token=token)
            return
        seq.generated += 1
        self.metrics.tokens_generated_total += 1
        if seq.first_token_ns is None:
            seq.first_token_ns = now
            prompt_qos = INTERACTIVE if seq.interactive else BACKGROUND
            self.metrics.observe_ttft(prompt_qos, (now - seq.arrival_ns) * 1e-6)
        else:
            self.metrics.observe_itl(req.qos, (now - (seq.last_token_ns or now)) * 1e-6)
        seq.last_token_ns = now
        text = seq.text.push(self.runtime.piece(token))
        if seq.text.stopped:
            self._emit_text(seq, text, token, lp)
            self._finish(seq, "stop", now)
        elif seq.generated >= req.max_tokens or seq.n_past + 1 >= self.runtime.n_ctx_per_seq:
            self._emit_text(seq, text + seq.text.flush(), token, lp)
            self._finish(seq, "length", now)
        else:
            self._emit_text(seq, text, token, lp)
            seq.next_token = token
            seq.out.append(token)
            if seq.ngrams is not None:
                seq.ngrams.append(token)

    def _emit_text(self, seq: Sequence, text: str, token: int, lp: p.Logprobs | None) -> None:
        event = seq.token_event(text, token, lp)
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
        if reason == "stop" and (rest := seq.text.flush()):
            self._emit_text(seq, rest, token, None)
        if seq.seq_id >= 0 and self._running.pop(seq.seq_id, None) is seq:
            self._ended.append((seq, reason))
        self._samplers.release(seq.seq_id, seq.sampler)
        self.metrics.requests_total[reason] += 1
        self.metrics.e2e_ms.observe((now - seq.arrival_ns) * 1e-6)
        self.metrics.request_prompt_tokens.observe(len(seq.prompt))
        self.metrics.request_generation_tokens.observe(seq.generated)
        self.metrics.active_sessions = len(self._running)
        self.metrics.kv_cells_used = sum(s.n_past for s in self._running.values())
        if send:
            self._out.append((seq.conn_id, seq.final_event(reason, now, detail)))

    def _release_ended(self) -> float:
        """Cache finished sequences' prefixes, free their KV and ids; the seconds it took. Run
        at the next decode's launch (a GPU computes meanwhile) or for an admission needing them."""
        if not self._ended:
            return 0.0
        t0 = time.perf_counter()
        ended, self._ended = self._ended, []  # taken first: a failure is not met again
        for seq, reason in ended:
            if self._prefix is not None and reason != "error" and seq.n_past > 0:
                self._prefix.store(seq)
            self.runtime.seq_clear(seq.seq_id)
            self._queue.release(seq.seq_id)
        return time.perf_counter() - t0

    def _flush(self) -> None:
        if self._out:
            out, self._out = self._out, []
            self.sink(out)

    def _drain(self, detail: str, reason: str = "cancelled") -> None:
        now = time.monotonic_ns()
        for seq in list(self._queue.waiting) + list(self._running.values()):
            self._finish(seq, reason, now, detail)
        self._release_ended()
        self._queue.waiting.clear()
        self.metrics.waiting_sessions = 0
        self._flush()
