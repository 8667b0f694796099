"""A conversation against the prefix cache: its history is kept while one-shot documents
stream through, and its next turn is a chat turn (pure logic, no model; the real model's side
is bench conversation and tests/integration/test_prefix_cache.py)."""

from __future__ import annotations

import threading

from test_engine_fake_runtime import FakeRuntime

from uma_serve.core import protocol as p
from uma_serve.core.engine import Engine, Submission
from uma_serve.core.policy import Constraints
from uma_serve.core.policy.pipeline import build_policy
from uma_serve.core.prefix.index import BLOCK, PrefixIndex, block_hashes
from uma_serve.core.runtime import RuntimeParams

SYS = list(range(1000, 1000 + 10 * BLOCK))  # an app's system prompt, 10 blocks


def doc(k: int, n: int = 40 * BLOCK) -> list[int]:
    return list(range(100_000 * (k + 1), 100_000 * (k + 1) + n))


def test_a_reused_conversation_survives_a_stream_of_one_shot_documents() -> None:
    """Budget for the conversation and about two documents; twenty documents pass through.
    Least-recently-used eviction alone would drop the conversation at the third."""
    idx = PrefixIndex(range(10, 16), budget_tokens=len(SYS) + 20 * BLOCK + 2 * len(doc(0)))
    turn1 = SYS + list(range(1, 6 * BLOCK))  # system prompt, question, answer
    first = idx.plan_store(turn1, None, 0).entry
    entry, n = idx.lookup(turn1 + [7, 7, 7])  # the next turn re-sends its history
    assert entry is first and n == len(turn1)
    idx.touch(entry, reused=True)
    turn2 = turn1 + list(range(7, 7 + 3 * BLOCK))
    second = idx.plan_store(turn2, first.cache_id, n).entry
    assert second is not None and second.hits == 1  # it extends a prefix seen twice
    for k in range(20):
        idx.plan_store(doc(k), None, 0)
        assert second.cache_id in idx.entries, f"evicted by document {k}"
        assert idx.resident_tokens <= idx.budget
    assert idx.lookup(turn2 + [9])[1] == len(turn2)
    assert sum(e.hits == 0 for e in idx.entries.values()) >= 1  # documents still cached


def test_a_turn_whose_history_was_pushed_out_is_kept_the_next_time() -> None:
    """A busy server evicts a new conversation's first turn (never reused yet) before its
    second arrives: that turn recomputes its history, and its entry, a prefix an evicted
    entry held (a ghost), is kept from then on. A document seen once stays a candidate."""
    idx = PrefixIndex(range(10, 13), budget_tokens=2 * len(doc(0)) + 30 * BLOCK)
    turn1 = SYS + list(range(1, 6 * BLOCK))
    idx.plan_store(turn1, None, 0)
    for k in range(3):
        idx.plan_store(doc(k), None, 0)
    assert idx.lookup(turn1)[0] is None  # pushed out before the next turn came
    second = idx.plan_store(turn1 + [7] * BLOCK, None, 0).entry  # computed again, stored
    assert second.hits == 1
    for k in range(3, 20):
        idx.plan_store(doc(k), None, 0)
        assert second.cache_id in idx.entries, f"evicted by document {k}"
    assert idx.plan_store(doc(0), None, 0).entry.hits == 1  # the first document, again
    assert idx.plan_store(doc(30), None, 0).entry.hits == 0


def test_documents_go_before_a_reused_entry_also_out_of_ids() -> None:
    idx = PrefixIndex([10, 11], budget_tokens=10_000)
    chat = idx.plan_store(SYS + [1, 2, 3], None, 0).entry
    idx.touch(chat, reused=True)
    idx.plan_store(doc(0), None, 0)
    idx.plan_store(doc(1), None, 0)  # out of ids: the document goes, though more recent
    assert chat.cache_id in idx.entries
    assert idx.lookup(doc(1))[1] == len(doc(1))


def test_a_paste_after_a_reused_system_prompt_extends_it_and_one_with_no_reuse_does_not() -> None:
    idx = PrefixIndex(range(10, 14), budget_tokens=100_000)
    base = idx.plan_store(SYS + [1], None, 0).entry
    idx.touch(base, reused=True)
    pasted = idx.plan_store(SYS + doc(0), base.cache_id, len(SYS)).entry
    alone = idx.plan_store(doc(1), None, 0).entry
    short = idx.plan_store(SYS[:BLOCK] + doc(2), base.cache_id, BLOCK).entry  # one block
    assert (pasted.hits, alone.hits, short.hits) == (1, 0, 0)


def test_room_for_running_sequences_is_taken_from_one_shot_entries_first() -> None:
    idx = PrefixIndex(range(10, 14), budget_tokens=100_000)
    chat = idx.plan_store(SYS + [1, 2], None, 0).entry
    idx.touch(chat, reused=True)
    docs = [idx.plan_store(doc(k), None, 0).entry.cache_id for k in range(2)]
    assert sorted(idx.clear(cold_first=True)) == sorted(docs)
    assert idx.clear(cold_first=True) == [chat.cache_id]  # then what is left


def test_the_estimate_counts_cached_blocks_from_the_start() -> None:
    idx = PrefixIndex([10], budget_tokens=10_000)
    idx.plan_store(SYS, None, 0)
    assert idx.cached_length(block_hashes(SYS + [5] * 100)) == len(SYS)
    assert idx.cached_length(block_hashes([5] * BLOCK + SYS)) == 0


class CountingRuntime(FakeRuntime):
    """The fake runtime with cache ids and room for long prompts; records the tokens each
    decode carried."""

    def __init__(self, n_seq: int = 4, n_cache: int = 4) -> None:
        super().__init__(n_seq)
        self.params = RuntimeParams(model_path="fake", n_seq=n_seq, n_seq_cache=n_cache)
        self.n_ctx, self.n_ctx_per_seq, self.n_batch = 8192, 2048, 512
        self.decodes: list[list[tuple[int, int]]] = []  # per decode: (seq_id, n_tokens)

    def decode(self, spans):
        self.decodes.append([(s.seq_id, len(s.tokens)) for s in spans])
        return super().decode(spans)


def submission(rid: str, prompt: list[int], t: int = 0) -> Submission:
    req = p.Generate(id=rid, prompt="x", max_tokens=2, ignore_eos=True)
    return Submission((1, rid), req, prompt, t)


def engine_with(rt: CountingRuntime, sink=lambda batch: None) -> Engine:
    """umad's default policy and reserved chat sequence, the prefix cache on."""
    return Engine(
        rt,
        build_policy(["qos", "latency"]),
        Constraints(n_batch=512, tick_budget_ms=50.0),
        sink,
        seed=1,
        prefix_cache_tokens=8192,
        reserved_interactive=1,
    )


def test_a_conversations_next_turn_is_classified_by_its_uncached_part() -> None:
    """The history's KV is cached after a turn: the next turn's work is its new part, within
    the allowance, so it is a chat turn, on arrival (the abort window) and in the queue; the
    same prompt with nothing cached is bulk work."""
    engine = engine_with(CountingRuntime())
    history = SYS + list(range(1, 40 * BLOCK + 1))  # 50 blocks: over any allowance
    assert len(history) > engine.prompt_allowance() > 5
    engine.scheduler._prefix._prefix.plan_store(history, None, 0)  # the last turn's KV
    engine.submit(submission("turn", history + [7] * 5))
    assert engine._inbox._interactive_waiting  # a chat turn's arrival: it may abort bulk work
    engine.submit(submission("cold", doc(0, len(history) + 5)))
    ops, _ = engine._inbox.take(lambda: True, lambda: None)
    for op in ops:
        engine.scheduler.add(op)
    turn, cold = engine.scheduler._queue.waiting
    assert (turn.interactive, cold.interactive) == (True, False)


def test_a_turn_computes_only_its_new_part_and_sharers_start_in_one_tick() -> None:
    """Four requests re-sending a cached history are admitted together and their new parts
    prefilled in the same decode (none waits for another's answer)."""
    rt = CountingRuntime()
    events: list = []
    done = threading.Event()

    def sink(batch):
        events.extend(batch)
        if sum(isinstance(e, p.EosEvent) for _, e in events) in (1, 5):
            done.set()

    engine = engine_with(rt, sink)
    history = SYS + list(range(1, 40 * BLOCK + 1))
    engine.start()
    try:
        engine.submit(submission("first", history))
        assert done.wait(10)
        done.clear()
        n = len(rt.decodes)
        for k in range(4):
            engine.submit(submission(f"s{k}", history + [2, 10 + k, 10 + k], k))
        assert done.wait(10)
    finally:
        engine.stop("test over")
        engine.join(5)
    prefill = rt.decodes[n]  # the first decode after they arrived
    assert len(prefill) == 4 and all(n_tok <= 4 for _, n_tok in prefill), prefill


class ArrivingRuntime(CountingRuntime):
    """Each prefix copy (an admission's KV tagging) sees the next sharer arrive meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list = []  # submissions posted, one per copy, while admitting
        self.engine: Engine | None = None

    def seq_copy(self, src: int, dst: int, n: int) -> None:
        if self.arrivals and self.engine is not None and dst < self.params.n_seq:
            self.engine.submit(self.arrivals.pop(0))


def test_sharers_that_arrive_while_others_are_admitted_start_in_the_same_tick() -> None:
    """Requests posted while the engine admits others (each admission tags its cached
    prefix's cells, host work) join the tick that follows, instead of the next one."""
    rt = ArrivingRuntime()
    ended = threading.Event()

    def sink(batch):
        if any(isinstance(e, p.EosEvent) for _, e in batch):
            ended.set()

    engine = engine_with(rt, sink)
    rt.engine = engine
    history = SYS + list(range(1, 40 * BLOCK + 1))
    engine.start()
    try:
        engine.submit(submission("first", history))
        assert ended.wait(10)
        n = len(rt.decodes)
        rt.arrivals = [submission(f"s{k}", history + [2, 10 + k, 10 + k], k) for k in (1, 2, 3)]
        ended.clear()
        engine.submit(submission("s0", history + [2, 10, 10]))
        assert ended.wait(10)
    finally:
        engine.stop("test over")
        engine.join(5)
    first_tick = rt.decodes[n]
    assert sorted(n_tok for _, n_tok in first_tick) == [3, 3, 3, 3], rt.decodes[n:]
