"""Hard faults (a failed llama_decode, a model without a chat template) cost only the request
they hit: it gets its documented error, the daemon keeps serving other sessions, no KV slot
leaks, and nothing is logged as a traceback. The faults are injected (core/faults.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from uma_serve.core import protocol as p

from .helpers import Daemon, gen, raw_socket, read_event, start_daemon, wait_idle

MARKER = "FAIL-THIS-DECODE"


@pytest.fixture(scope="module")
def faulty(tmp_path_factory) -> Iterator[Daemon]:
    tmp: Path = tmp_path_factory.mktemp("faults")
    env = {"UMA_FAULT_DECODE_FAIL": MARKER, "UMA_FAULT_NO_CHAT_TEMPLATE": "1"}
    daemon = start_daemon(tmp, "--n-ctx", "2048", env=env)
    yield daemon
    daemon.stop()


def until_final(s, rid: str) -> list[p.Event]:
    events = []
    while True:
        ev = read_event(s)
        assert ev is not None, "connection closed"
        events.append(ev)
        if getattr(ev, "id", None) == rid and isinstance(ev, p.EosEvent | p.ErrorEvent):
            return events


def assert_clean(daemon: Daemon) -> None:
    m = wait_idle(daemon)
    assert (m["kv_cells_used"], m["active_sessions"], m["waiting_sessions"]) == (0, 0, 0)
    with daemon.client() as c:  # other sessions are served
        done = c.complete(gen("Still serving?", max_tokens=4, ignore_eos=True))
    assert done.reason == "length" and done.usage.completion_tokens == 4
    assert "Traceback" not in daemon.log()


def test_decode_failure_is_e_runtime_and_costs_only_its_request(faulty) -> None:
    s = raw_socket(faulty.socket)
    s.sendall(p.encode(gen(f"Please {MARKER} now", id="bad", max_tokens=20)))
    events = until_final(s, "bad")
    assert isinstance(events[-1], p.ErrorEvent) and events[-1].code == p.E_RUNTIME
    assert "llama_decode failed" in events[-1].message
    # the same connection goes on: a healthy request right after is served in full
    s.sendall(p.encode(gen("A healthy one", id="good", max_tokens=6, ignore_eos=True)))
    final = until_final(s, "good")[-1]
    assert isinstance(final, p.EosEvent) and final.usage.completion_tokens == 6
    s.close()
    assert_clean(faulty)
    assert faulty.metrics()["requests_total"]["error"] >= 1


def test_messages_without_chat_template_is_e_model(faulty) -> None:
    s = raw_socket(faulty.socket)
    s.sendall(p.encode(gen("Long running", id="other", max_tokens=30, ignore_eos=True)))
    chat = p.Generate(id="chat", messages=[p.Message(role="user", content="Hi")])
    s.sendall(p.encode(chat))
    events = until_final(s, "other")
    errors = [e for e in events if isinstance(e, p.ErrorEvent)]
    assert [(e.id, e.code) for e in errors] == [("chat", p.E_MODEL)]
    assert "chat template" in errors[0].message
    assert events[-1].reason == "length" and events[-1].usage.completion_tokens == 30
    s.close()
    assert_clean(faulty)
