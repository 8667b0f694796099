"""The output step (core/engine/output.py) on its own: tokens to text events, stop strings,
lengths, end-of-generation, and the request's metrics (no engine, no decode)."""

from __future__ import annotations

from test_engine_fake_runtime import FakeRuntime

from uma_serve.core import protocol as p
from uma_serve.core.engine.output import Output
from uma_serve.core.engine.sequence import Sequence
from uma_serve.core.metrics import EngineMetrics


class EogRuntime(FakeRuntime):
    def is_eog(self, token: int) -> bool:
        return token == 0


def seq(**req) -> Sequence:
    r = p.Generate(id="r", prompt="x", **req)
    s = Sequence((7, "r"), r, [1, 2, 3], arrival_ns=0, seq_id=0)
    s.n_past = 3
    return s


def run(s: Sequence, tokens: list[int]) -> tuple[list[p.Event], list[str | None], EngineMetrics]:
    m = EngineMetrics()
    out_step, out, ends = Output(EogRuntime(), m), [], []  # type: ignore[arg-type]
    for i, t in enumerate(tokens):
        end = out_step.take(s, t, None, now=(i + 1) * 1_000_000, out=out)
        if end is None:  # the engine launches the next tick, then flushes
            end = next((reason for _, reason in out_step.flush(out)), None)
        ends.append(end)
        if end is not None:
            break
    assert all(conn == 7 for conn, _ in out)
    return [e for _, e in out], ends, m


def test_tokens_stream_as_text_and_the_length_ends_the_request() -> None:
    s = seq(max_tokens=3)
    events, ends, m = run(s, [4, 5, 6, 7])
    assert ends == [None, None, "length"]
    assert [e.text for e in events if isinstance(e, p.TokenEvent)] == ["<4>", "<5>", "<6>"]
    assert isinstance(events[-1], p.EosEvent) and events[-1].reason == "length"
    assert s.next_token == 5 and s.out == [4, 5]  # the last token is not decoded again
    assert m.tokens_generated_total == 3 and m.requests_total["length"] == 1
    assert m.ttft_ms.count == 1 and m.inter_token_ms.count == 2


def test_a_stop_string_ends_the_request_and_its_text_is_held_back() -> None:
    s = seq(max_tokens=10, stop=["<5><6>"])
    events, ends, _ = run(s, [4, 5, 6, 7])
    assert ends == [None, None, "stop"]
    assert "".join(e.text for e in events if isinstance(e, p.TokenEvent)) == "<4>"
    assert isinstance(events[-1], p.EosEvent) and events[-1].reason == "stop"
    # found after the next tick was launched with it: its KV holds the token
    assert s.next_token == 6 and s.out == [4, 5, 6]


def test_a_token_waits_for_the_flush_unless_it_is_the_first_or_ends_the_request() -> None:
    s, out = seq(max_tokens=3), []
    step = Output(EogRuntime(), EngineMetrics())  # type: ignore[arg-type]
    assert step.take(s, 4, None, 1, out) is None and len(out) == 1  # the first: at once
    assert step.take(s, 5, None, 2, out) is None and len(out) == 1  # waits
    assert s.next_token == 5 and s.out == [4] and s.generated == 1
    assert step.flush(out) == [] and [e.text for _, e in out] == ["<4>", "<5>"]
    assert s.out == [4, 5] and s.generated == 2 and step.flush(out) == []
    assert step.take(s, 6, None, 3, out) == "length"  # an end: at once, with its text
    assert [type(e) for _, e in out][-2:] == [p.TokenEvent, p.EosEvent]


def test_end_of_generation_stops_unless_ignored() -> None:
    events, ends, _ = run(seq(max_tokens=10), [4, 0, 5])
    assert ends == [None, "stop"] and events[-1].reason == "stop"
    _, ends, _ = run(seq(max_tokens=10, ignore_eos=True), [4, 0, 5])
    assert ends == [None, None, None]


def test_a_failure_is_an_error_event_and_counted() -> None:
    s, m, out = seq(), EngineMetrics(), []
    Output(EogRuntime(), m).fail(s, "boom", 5, out)  # type: ignore[arg-type]
    assert [type(e) for _, e in out] == [p.ErrorEvent] and out[0][1].message == "boom"
    assert m.requests_total["error"] == 1
