"""Generate.grammar through the daemon: validated at the door, batched with plain requests."""

from __future__ import annotations

import json

from uma_serve.core import protocol as p

from .helpers import frame, gen, raw_socket, read_event

DIGITS = 'root ::= "{\\"n\\": " [1-9] [0-9]? "}"'


def test_a_grammar_that_does_not_parse_is_e_proto_naming_the_field(umad) -> None:
    s = raw_socket(umad.socket)
    s.sendall(frame(b'{"id": "g", "prompt": "hi", "grammar": "root ::= nowhere"}'))
    ev = read_event(s)
    assert isinstance(ev, p.ErrorEvent) and ev.code == p.E_PROTO and "'grammar'" in ev.message
    s.sendall(frame(b'{"id": "g2", "prompt": "hi", "grammar": ""}'))  # empty: schema error
    ev = read_event(s)
    assert isinstance(ev, p.ErrorEvent) and ev.code == p.E_PROTO and "grammar" in ev.message
    s.close()


def test_constrained_and_plain_requests_in_the_same_ticks(umad) -> None:
    with umad.client() as c:
        reqs = [
            gen("Count:", id="plain-0", max_tokens=24, temperature=0.8, seed=1),
            gen("JSON:", id="json-0", max_tokens=24, grammar=DIGITS),
            gen("Count:", id="plain-1", max_tokens=24, temperature=0.8, seed=2),
            gen("JSON:", id="json-1", max_tokens=24, temperature=0.9, seed=3, grammar=DIGITS),
        ]
        for r in reqs:
            c.send(r)
        texts: dict[str, str] = {r.id: "" for r in reqs}
        ends: dict[str, str] = {}
        while len(ends) < len(reqs):
            ev = c.read_event()
            if isinstance(ev, p.TokenEvent):
                texts[ev.id] += ev.text
            elif isinstance(ev, p.EosEvent):
                ends[ev.id] = ev.reason
            else:
                raise AssertionError(ev)
    for rid in ("json-0", "json-1"):
        assert ends[rid] == "stop", (rid, texts[rid])
        value = json.loads(texts[rid])
        assert 1 <= value["n"] <= 99
    assert ends["plain-0"] in ("stop", "length") and texts["plain-0"]


def test_max_tokens_cuts_a_constrained_answer_short_as_length(umad) -> None:
    with umad.client() as c:
        ev = c.complete(gen("JSON:", max_tokens=2, grammar=DIGITS, stream=False))
    assert isinstance(ev, p.CompletionEvent) and ev.reason == "length"
    assert ev.text.startswith("{") and ev.usage.completion_tokens == 2
