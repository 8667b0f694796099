"""The scheduler: which sequences run, and what each tick carries.

It owns the running set and the admission queue, uses the prefix cache on admission and on
a sequence's end, shows the policy a side-effect-free snapshot and turns its plan into the
executor's Batch. At the launch it moves the tick's sequences to where the tick leaves them
(so the next tick can be planned while the device computes); once the tick is collected it
gives its tokens to the output step (core/engine/output.py: ends at once; text, stop strings
and events once the next tick is launched, ``flush``), applies what a failed tick's decision
says (core/engine/recovery.py) and gives the tick's time to the learner (learner.py).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

import msgspec
from msgspec.structs import replace

from uma_serve.core import protocol as p
from uma_serve.core.engine.learner import TickLearner
from uma_serve.core.engine.output import Output
from uma_serve.core.engine.recovery import (
    Aborted,
    EvictCache,
    FailBatch,
    FailLongest,
    Retry,
    ShrinkPrefill,
    decide,
)
from uma_serve.core.engine.sequence import Sequence, Submission
from uma_serve.core.engine.speculation import Speculation
from uma_serve.core.engine.tick import Batch, Failure, Outgoing, Sampled, TickResult
from uma_serve.core.engine.waiting import WaitingQueue
from uma_serve.core.metrics import EngineMetrics
from uma_serve.core.policy import Constraints, Phase, Plan, Policy, SchedulerState
from uma_serve.core.policy.pipeline import PolicyPipeline
from uma_serve.core.policy.work import INTERACTIVE, prompt_allowance, prompt_class
from uma_serve.core.prefix.store import PrefixStore
from uma_serve.core.runtime.api import RuntimeApi
from uma_serve.core.sampling import Sampler

log = logging.getLogger("uma.engine")
Match = Callable[[Sequence], bool]


class Planned(msgspec.Struct, frozen=True):
    """A tick's plan, the state it was planned from and its items' sequences (a tick in
    flight may end some of them before the plan becomes a batch)."""

    plan: Plan
    state: SchedulerState
    seqs: tuple[Sequence, ...]


class Scheduler:
    def __init__(
        self,
        runtime: RuntimeApi,
        policy: Policy,
        constraints: Constraints,
        metrics: EngineMetrics,
        sampler: Sampler,
        seed: int | None = None,
        reserved_interactive: int = 0,
        prefix_cache_tokens: int = 0,
        prefix_cache_slots: int = 0,
    ) -> None:
        self.runtime = runtime
        self.policy = policy
        self.constraints = constraints
        self.metrics = metrics
        self.gauges = metrics.state()  # its sequences, in the exported gauges
        self._sampler = sampler
        self._output = Output(runtime, metrics)
        self._rng = random.Random(seed)
        self._queue = WaitingQueue(range(runtime.params.n_seq), reserved_interactive)
        self._prefix = PrefixStore.build(
            runtime, metrics, constraints, prefix_cache_tokens, prefix_cache_slots
        )
        self._spec = Speculation(constraints.spec_max_draft, constraints.spec_max_streams, metrics)
        self.running: dict[int, Sequence] = {}  # seq_id -> sequence
        transformers = policy.transformers if isinstance(policy, PolicyPipeline) else ()
        self.learner = TickLearner(constraints, transformers)
        self._max_prefill: int | None = None  # cap after a failed decode (no KV slot)
        self._ended: list[tuple[Sequence, str]] = []  # finished, KV not yet released
        self._last_interactive_ns = 0  # when an interactive request last ran or waited

    # ---- requests in and out ----

    def prompt_allowance(self) -> int:
        """Uncached prompt tokens of a chat turn at most, from the current tick-time model."""
        return prompt_allowance(self.learner.stats.cost, self.constraints)

    def cached_estimate(self, prompt_hashes: list[int]) -> int:
        """Cached leading tokens of a prompt, by its block hashes (from the I/O thread)."""
        return self._prefix.estimate(prompt_hashes) if self._prefix is not None else 0

    def add(self, sub: Submission) -> None:
        """Queue a request, classified by the prompt work it leaves once the prefix cache
        (or a running sequence) serves what it can: a conversation's next turn, which re-sends
        its whole history, is a chat turn (policy/work.py)."""
        seq = Sequence(
            sub.key, sub.request, sub.prompt, sub.arrival_ns, prompt_hashes=sub.prompt_hashes
        )
        cached = 0
        if self._prefix is not None:
            cached = self._prefix.cached_length(seq, self.running.values())
        seq.bulk_prompt = len(seq.prompt) - cached > self.prompt_allowance()
        self._queue.waiting.append(seq)
        self.gauges.waiting_sessions = len(self._queue)

    def cancel(self, match: Match, detail: str) -> list[Outgoing]:
        """Idempotent: a request already finished or unknown is ignored."""
        now, out = time.monotonic_ns(), self.flush()
        for seq in [*self._queue.remove(match), *[s for s in self.running.values() if match(s)]]:
            self._finish(seq, "cancelled", now, out, detail)
        self.gauges.waiting_sessions = len(self._queue)
        return out

    def load(self) -> int:
        """Requests it holds, running or waiting."""
        return len(self.running) + len(self._queue)

    def has_room(self, sub: Submission, cached: int) -> bool:
        """A free sequence id ``sub`` could take (``cached``: its prompt's tokens this
        scheduler's prefix cache holds): a chat turn any, other work one beyond those kept
        for chat turns (waiting.py)."""
        work = prompt_class(sub.request.qos, len(sub.prompt) - cached, self.prompt_allowance())
        free = len(self._queue.free_ids) - len(self._queue)
        return free > (0 if work == INTERACTIVE else self._queue.reserved)

    def holds_bulk(self) -> bool:
        """Bulk work running or waiting here: a long prompt not yet prefilled, a background
        request (policy/work.py)."""
        seqs = [*self.running.values(), *self._queue.waiting]
        return any(s.work_class != INTERACTIVE for s in seqs)

    def busy(self) -> bool:
        """Work without new input: running requests, or one that can take a free sequence
        (idle time between is not tick overhead)."""
        return bool(self.running) or self._queue.admittable(self._hold())

    def _hold(self) -> Match | None:  # waiting for a leader's prefix
        return self._prefix.holder(self.running.values()) if self._prefix else None

    def admit(self) -> None:
        if self._ended and len(self._queue):  # a waiting request may need their ids or KV
            self.release_ended()
        now = time.monotonic_ns()
        while (seq := self._queue.admit(self._hold(), self._suits)) is not None:
            seq.admitted_ns = seq.last_progress_ns = now
            seq.sampler = self._sampler.new(seq.seq_id, seq.request, self._rng.getrandbits(32))
            self.runtime.seq_clear(seq.seq_id)
            if self._prefix is not None:
                seq.reused = self._prefix.reuse(seq, self.running.values())
                seq.n_past = seq.reused.tokens
            seq.bulk_prompt = seq.pending_prefill > self.prompt_allowance()
            self._spec.start(seq)
            self.running[seq.seq_id] = seq
            self.metrics.queue_ms.observe((now - seq.arrival_ns) * 1e-6)
        self.gauges.waiting_sessions = len(self._queue)
        self.gauges.active_sessions = len(self.running)

    def _suits(self, seq: Sequence) -> Callable[[int], bool] | None:
        """A request takes a free id whose device chain is the one it needs, when there is one
        (sampling.py: each switch costs a graph reservation)."""
        return self._sampler.suits(seq.request)

    def pin_prefix(self, tokens: list[int], kv_path: str | None) -> str:
        """Keep ``tokens``' KV resident for good (call before start): see PrefixStore.pin."""
        return self._prefix.pin(tokens, kv_path) if self._prefix is not None else "off"

    # ---- one tick ----

    @property
    def plans_ahead(self) -> bool:
        """Whether a tick can be planned before the tokens of the one in flight are known:
        not while speculative drafts continue them."""
        return not self._spec.on

    def plan(self, ahead: bool = False) -> Planned:
        """Propose drafts (not ``ahead``: the tokens are in), note a conversation, show the
        policy the snapshot: its plan. Ahead, the sequences of the tick in flight are shown
        where it leaves them, their next token not yet drawn."""
        now = time.monotonic_ns()
        if not ahead:
            self._spec.propose(self.running.values(), self.runtime.n_ctx_per_seq)
        if any(s.interactive for s in self.running.values()) or self._queue.has_interactive():
            self._last_interactive_ns = now  # a conversation is going on
        state = self.snapshot(now)
        constraints = replace(self.constraints, max_prefill_tokens=self._max_prefill)
        plan = self.policy.schedule_tick(state, constraints)
        return Planned(plan, state, tuple(self.running[i.seq_id] for i in plan.items))

    def batch(self, planned: Planned) -> Batch:
        """The plan's spans and sampler rows, from its sequences as they are now: one that
        ended since (by the tick in flight, or a cancel) drops out. Before the launch, with
        the device idle: the sampler's device top-k changes are applied here."""
        kept = [
            (item, seq)
            for item, seq in zip(planned.plan.items, planned.seqs, strict=True)
            if self.running.get(seq.seq_id) is seq
            and (item.phase is Phase.PREFILL or seq.next_token is not None)
        ]
        plan = planned.plan
        if len(kept) < len(plan.items):
            plan = replace(plan, items=tuple(item for item, _ in kept))
        self._sampler.apply()
        spans = tuple(seq.span(item) for item, seq in kept)
        draws = tuple(seq.draw(item, sp) for (item, seq), sp in zip(kept, spans, strict=True))
        # a tick of bulk work only: a chat turn's arrival stops it (its chunk is redone later)
        abortable = all(seq.work_class != INTERACTIVE for _, seq in kept)
        return Batch(plan, planned.state, spans, draws, abortable)

    def launched(self, batch: Batch) -> tuple[Sequence, ...]:
        """The tick is on its way: its sequences stand where it leaves them (the next tick is
        planned meanwhile); its tokens come in ``advance``, given these sequences back. A
        drafted decode moves there by what the verification accepts."""
        seqs = tuple(self.running[item.seq_id] for item in batch.plan.items)
        for item, seq in zip(batch.plan.items, seqs, strict=True):
            if item.phase is Phase.DECODE and item.n_tokens > 1:
                continue
            seq.n_past += item.n_tokens
            if item.phase is Phase.DECODE:
                seq.next_token = None
        return seqs

    def snapshot(self, now_ns: int) -> SchedulerState:
        """The running sequences as the policy sees them (no side effects)."""
        views = tuple(s.view() for s in self.running.values())
        return SchedulerState(views, self.learner.stats, now_ns, self._last_interactive_ns)

    def advance(
        self, batch: Batch, seqs: tuple[Sequence, ...], result: TickResult
    ) -> list[Outgoing]:
        """The collected tick's tokens as events (``seqs``: what ``launched`` gave); a failed
        tick's consequences."""
        out: list[Outgoing] = []
        try:
            self.learner.tick_started(result.t0, self.metrics)
            self.learner.tick_decoded(result.t0, result.ms, result.overlap_ms)
            if result.failure is not None:
                self._undo(batch, seqs)
                self._recover(result.failure, result.rc, batch.plan, seqs, out)
            else:
                self._advance(batch, seqs, result.sampled, out)
        except Exception:  # a bug costs the running requests, not the daemon
            log.exception("tick failed: ending the running requests")
            out += self.fail_running("internal error in the engine tick")
        return out

    def record(self, batch: Batch, result: TickResult) -> None:
        """The learner learns a collected tick's time (the next tick computes meanwhile)."""
        if result.failure is not None:
            return
        self.learner.record(result.ms, batch.plan, batch.state, self.metrics)
        self.metrics.observe_tick_parts(result.ms, result.sample_ms, result.overlap_ms)
        self.metrics.decode_graph_rebuilds_total += not result.graph_reused
        if self._max_prefill is not None:  # recover gradually after a failed decode
            doubled = self._max_prefill * 2
            self._max_prefill = doubled if doubled < self.constraints.n_batch else None

    def _undo(self, batch: Batch, seqs: tuple[Sequence, ...]) -> None:
        """A failed tick's sequences back where it found them (its KV writes are undone)."""
        for item, span, seq in zip(batch.plan.items, batch.spans, seqs, strict=True):
            seq.n_past = span.pos
            if item.phase is Phase.DECODE:
                seq.next_token = span.tokens[0]

    def _advance(
        self,
        batch: Batch,
        seqs: tuple[Sequence, ...],
        sampled: tuple[Sampled, ...],
        out: list[Outgoing],
    ) -> None:
        now = time.monotonic_ns()
        served = {item.seq_id for item in batch.plan.items}
        for seq in self.running.values():
            if seq.seq_id not in served:
                seq.burst = 0
        drafted: list[tuple[Sequence, int, Sampled]] = []
        for item, seq, got in zip(batch.plan.items, seqs, sampled, strict=True):
            if self.running.get(seq.seq_id) is not seq:
                continue  # ended while its tick computed (a cancel, a stop string)
            seq.last_progress_ns = now
            seq.burst = seq.burst + 1 if item.phase is Phase.DECODE else 0
            if item.phase is Phase.DECODE and item.n_tokens > 1:
                drafted.append((seq, item.n_tokens - 1, got))
                continue
            if item.phase is Phase.PREFILL and not seq.pending_prefill:
                seq.prefill_done_ns = now
            if got.tokens:
                self._emit(seq, got.tokens[0], got.logprobs[0], now, out)
        for seq, n_drafts, got in drafted:
            drafts = list(seq.draft[:n_drafts])
            self._spec.take(seq, drafts, got, lambda t, lp, s=seq: self._emit(s, t, lp, now, out))
            if self.running.get(seq.seq_id) is seq:  # the KV beyond the accepted run goes
                self.runtime.seq_trim(seq.seq_id, seq.n_past)
        self.gauges.kv_cells_used = sum(s.n_past for s in self.running.values())

    def _recover(
        self, failure: Failure, rc: int, plan: Plan, seqs: tuple[Sequence, ...], out: list[Outgoing]
    ) -> None:
        """Apply what follows from a failed tick (core/engine/recovery.py decides it)."""
        n_prefill = sum(i.n_tokens for i in plan.items if i.phase is Phase.PREFILL)
        evictable = self._prefix is not None and self._prefix.can_evict()
        decision = decide(failure, rc, n_prefill, evictable)
        if not isinstance(decision, Aborted):
            self.metrics.decode_failures_total += 1
        now = time.monotonic_ns()
        match decision:
            case Aborted() | Retry():  # the tick's time teaches nothing
                self.metrics.ticks_aborted_total += isinstance(decision, Aborted)
                self.learner.idle()
            case EvictCache():
                assert self._prefix is not None
                self._prefix.evict_for_room()
                log.warning("no KV slot for %d tokens: evicted cached prefixes", plan.n_tokens)
            case ShrinkPrefill(n=n):
                self._max_prefill = n
                log.warning("no KV slot for %d tokens: shrinking prefill to %d", plan.n_tokens, n)
            case FailLongest():
                victim = max(self.running.values(), key=lambda s: s.n_past)
                self._fail(victim, "KV cache full: no slot for this sequence", now, out)
            case FailBatch(rc=rc):
                log.error("llama_decode returned %d: failing the batch's requests", rc)
                for seq in [s for s in seqs if self.running.get(s.seq_id) is s]:
                    self._fail(seq, f"llama_decode failed (rc={rc})", now, out)

    # ---- tokens and ends ----

    def _emit(
        self, seq: Sequence, token: int, lp: p.Logprobs | None, now: int, out: list[Outgoing]
    ) -> bool:
        """A sampled token to the output step; False when it ended the sequence."""
        reason = self._output.take(seq, token, lp, now, out)
        if reason is not None:
            self._retire(seq, reason)
        return reason is None

    def flush(self) -> list[Outgoing]:
        """The output step's held tokens as text and events (call once the next tick is
        launched); a stop string ends its sequence, its row in flight dropped like a cancel's."""
        out: list[Outgoing] = []
        for seq, reason in self._output.flush(out):
            self._retire(seq, reason)
        return out

    def fail_running(self, message: str) -> list[Outgoing]:
        self._output.pending.clear()  # their requests fail: their tokens go unsaid
        now, out = time.monotonic_ns(), []
        for seq in list(self.running.values()):
            self._fail(seq, message, now, out)
        return out

    def _fail(self, seq: Sequence, message: str, now: int, out: list[Outgoing]) -> None:
        self._output.fail(seq, message, now, out)
        self._retire(seq, "error")

    def _finish(self, seq: Sequence, why: str, now: int, out: list[Outgoing], detail: str) -> None:
        self._output.end(seq, why, now, out, detail)
        self._retire(seq, why)

    def _retire(self, seq: Sequence, reason: str) -> None:
        """A sequence that ended leaves the running set; its KV and id go at the next
        release (release_ended), its sampler now."""
        if seq.seq_id >= 0 and self.running.pop(seq.seq_id, None) is seq:
            self._ended.append((seq, reason))
        self._sampler.release(seq.sampler)
        self.gauges.active_sessions = len(self.running)
        self.gauges.kv_cells_used = sum(s.n_past for s in self.running.values())

    def release_ended(self) -> int:
        """Cache finished sequences' prefixes, free their KV and ids; how many. Run after the
        next decode's launch (a GPU computes meanwhile) or for an admission needing them."""
        ended, self._ended = self._ended, []  # taken first: a failure is not met again
        running = sum(s.n_past for s in self.running.values())
        for seq, reason in ended:
            if self._prefix is not None and reason != "error" and seq.n_past > 0:
                self._prefix.store(
                    seq.seq_id, seq.kv_tokens(), seq.reused, running, seq.bulk_prompt
                )
            self.runtime.seq_clear(seq.seq_id)
            self._queue.release(seq.seq_id)
        return len(ended)

    def drain(self, detail: str, reason: str = "cancelled") -> list[Outgoing]:
        """End every request, waiting or running."""
        now, out = time.monotonic_ns(), self.flush()
        for seq in list(self._queue.waiting) + list(self.running.values()):
            self._finish(seq, reason, now, out, detail)
        self.release_ended()
        self._queue.waiting.clear()
        self.gauges.waiting_sessions = 0
        return out
