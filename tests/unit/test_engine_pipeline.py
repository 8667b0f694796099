"""The tick left in flight between steps (``overlap``, a GPU's), on a fake runtime: the next
tick is planned while the device computes, a sequence that tick ends drops out of the planned
batch, and a cancel while it computes costs no other request anything."""

from __future__ import annotations

import threading

from test_engine_fake_runtime import FakeRuntime

from uma_serve.core import protocol as p
from uma_serve.core.engine import Engine, Submission
from uma_serve.core.policy import BaselinePolicy, Constraints

PROMPT = [1, 2, 3]


class Recording(FakeRuntime):
    """Logs its decodes (each span's sequence and position) and synchronizations; one chosen
    decode waits, once launched, until the test lets it return."""

    def __init__(self, n_seq: int = 4) -> None:
        super().__init__(n_seq)
        self.log: list[tuple] = []
        self.hold_at: int | None = None  # the decode (by count) that waits
        self.held = threading.Event()
        self.release = threading.Event()

    def decode(self, spans):
        self.log.append(("decode", tuple((s.seq_id, s.pos, len(s.tokens)) for s in spans)))
        if sum(1 for e in self.log if e[0] == "decode") == self.hold_at:
            self.held.set()
            assert self.release.wait(10)
        return super().decode(spans)

    def synchronize(self) -> int:
        self.log.append(("sync",))
        return super().synchronize()


class PlanLog(BaselinePolicy):
    def __init__(self, log: list[tuple]) -> None:
        super().__init__()
        self._log = log

    def schedule_tick(self, state, constraints):
        self._log.append(("plan",))
        return super().schedule_tick(state, constraints)


def engine_on(
    rt: Recording, events: list, done: threading.Event, finals: int, log_sinks: bool = False
) -> Engine:
    def sink(batch):
        if log_sinks:
            rt.log.append(("sink", tuple(type(e).__name__ for _, e in batch)))
        events.extend(batch)
        if sum(isinstance(e, p.EosEvent | p.ErrorEvent) for _, e in events) >= finals:
            done.set()

    c = Constraints(n_batch=64, tick_budget_ms=50.0)
    return Engine(rt, PlanLog(rt.log), c, sink, seed=1, overlap=True)


def tokens_of(events: list, rid: str) -> list[int]:
    return [e.token_id for _, e in events if isinstance(e, p.TokenEvent) and e.id == rid]


def run_one(rt: Recording, events: list, log_sinks: bool = False) -> None:
    """One greedy request of 6 tokens through an engine on ``rt``, to its end."""
    done = threading.Event()
    engine = engine_on(rt, events, done, 1, log_sinks)
    req = p.Generate(id="a", prompt="x", max_tokens=6, temperature=0.0, ignore_eos=True)
    engine.submit(Submission((1, "a"), req, PROMPT, 0))
    engine.start()
    assert done.wait(10)
    engine.stop("test over")
    engine.join(5)


def test_the_next_tick_is_planned_while_the_device_computes_the_one_in_flight() -> None:
    """Between a decode's launch and its synchronization the engine plans the next tick
    (a GPU computes meanwhile); the tokens are those of ticks run one after another."""
    rt = Recording()
    events: list = []
    run_one(rt, events)
    kinds = [e[0] for e in rt.log]
    planned_in_flight = sum(
        1 for i in range(len(kinds) - 2) if kinds[i : i + 3] == ["decode", "plan", "sync"]
    )
    assert planned_in_flight >= 4, kinds
    assert tokens_of(events, "a") == [4, 5, 6, 7, 8, 9]  # position % 10 + 1, as in order


def test_a_sequence_the_tick_in_flight_ends_is_not_in_the_next_batch() -> None:
    """A stop string in tick N's token ends the request once tick N+1 is launched with that
    token (its text is made while N+1 computes): N+1's row for it is dropped, no tick after
    carries it, and the other stream goes on undisturbed."""
    rt = Recording()
    events: list = []
    done = threading.Event()
    engine = engine_on(rt, events, done, 2)
    stop = p.Generate(id="s", prompt="x", max_tokens=8, temperature=0.0, stop="<6>")
    go = p.Generate(id="g", prompt="x", max_tokens=8, temperature=0.0, ignore_eos=True)
    engine.submit(Submission((1, "s"), stop, PROMPT, 0))
    engine.submit(Submission((1, "g"), go, [1, *PROMPT], 1))
    engine.start()
    assert done.wait(10)
    engine.stop("test over")
    engine.join(5)
    finals = {e.id: e for _, e in events if isinstance(e, p.EosEvent)}
    assert finals["s"].reason == "stop" and finals["g"].reason == "length"
    assert tokens_of(events, "g") == [5, 6, 7, 8, 9, 10, 1, 2]  # a 4-token prompt
    # the stopped sequence decoded its tokens 4, 5 and the stop's 6, and none after it
    spans = [s for e in rt.log if e[0] == "decode" for s in e[1]]
    s_id = next(seq for seq, pos, n in spans if pos == 0 and n == len(PROMPT))
    assert max(pos for seq, pos, _ in spans if seq == s_id) == len(PROMPT) + 2
    assert tokens_of(events, "s") == [4, 5, 6]  # the stop's token with its text held back
    after = [e for _, e in events[[e for _, e in events].index(finals["s"]) :] if e.id == "s"]
    assert after == [finals["s"]]  # nothing of the dropped row went out


def test_a_cancel_while_a_tick_computes_leaves_its_id_to_the_next_request() -> None:
    """With one sequence id: a request is cancelled while its tick computes and a new one
    takes the id at once; the old tick's token goes nowhere and the new request's tokens are
    its own from its first."""
    rt = Recording(n_seq=1)
    events: list = []
    done = threading.Event()
    engine = engine_on(rt, events, done, 2)
    old = p.Generate(id="old", prompt="x", max_tokens=50, temperature=0.0, ignore_eos=True)
    new = p.Generate(id="new", prompt="x", max_tokens=4, temperature=0.0, ignore_eos=True)
    rt.hold_at = 3  # the old request's second decode tick
    engine.submit(Submission((1, "old"), old, PROMPT, 0))
    engine.start()
    assert rt.held.wait(10)
    engine.cancel((1, "old"))
    engine.submit(Submission((1, "new"), new, [1, 2, 3, 4, 5], 1))
    rt.release.set()
    assert done.wait(10)
    engine.stop("test over")
    engine.join(5)
    finals = [e for _, e in events if isinstance(e, p.EosEvent)]
    assert sorted((e.id, e.reason) for e in finals) == [("new", "length"), ("old", "cancelled")]
    assert tokens_of(events, "new") == [6, 7, 8, 9]  # a 5-token prompt: positions 5.. -> +1
    assert len(tokens_of(events, "old")) == 2  # the held tick's token was not sent


def test_a_ticks_tokens_go_out_once_the_next_tick_is_launched() -> None:
    """The I/O thread that writes a tick's tokens takes the GIL whenever the engine thread
    lets it go: they are sent after the next tick's launch, while the device computes it,
    but for a request's first token; every token still comes out, in order, with its
    request's end."""
    rt = Recording()
    events: list = []
    run_one(rt, events, log_sinks=True)
    kinds = [e[0] for e in rt.log]
    token_sinks = [i for i, e in enumerate(rt.log) if e[0] == "sink" and "TokenEvent" in e[1]]
    assert len(token_sinks) >= 4
    # the first token goes out at once (the launch after a prompt may build a new graph);
    # each later sink of tokens but the last (the tick that ended the request) follows a
    # sync (its tick collected) and then a decode (the next tick launched)
    first, *later = token_sinks[:-1]
    assert [k for k in kinds[:first] if k in ("sync", "decode")][-1] == "sync", rt.log
    for i in later:
        before = [k for k in kinds[:i] if k in ("sync", "decode")]
        assert before[-2:] == ["sync", "decode"], rt.log
    assert len(tokens_of(events, "a")) == 6
