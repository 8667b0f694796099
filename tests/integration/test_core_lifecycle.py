"""Daemon lifecycle: socket ownership and mode, SIGTERM drain, idle timeout, slow readers."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import threading
import time

import pytest

from uma_serve.core import protocol as p
from uma_serve.core.server import CLOSE_GRACE_S

from .helpers import (
    VENV_BIN,
    gen,
    raw_socket,
    read_event,
    read_until_closed,
    start_daemon,
    wait_idle,
)


@pytest.fixture(scope="module")
def small_daemon(tmp_path_factory):
    """A daemon with a stale socket file left where it starts, tiny buffers and idle timeout."""
    tmp = tmp_path_factory.mktemp("lifecycle")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp / "uma.sock"))  # a socket file nobody listens on
    stale.close()
    daemon = start_daemon(
        tmp, "--idle-timeout", "1", "--max-write-buffer-bytes", "65536", "--n-ctx", "2048"
    )
    yield daemon
    daemon.stop()


def wait_for_log(daemon, text: str, timeout: float = 60, since: int = 0) -> None:
    """Until the daemon's log has ``text`` (a state it logs as it enters it) after its first
    ``since`` characters (what an earlier test of the same daemon logged)."""
    deadline = time.monotonic() + timeout
    while text not in daemon.log()[since:]:
        assert time.monotonic() < deadline, f"the daemon never logged {text!r}"
        time.sleep(0.05)


def test_stale_socket_replaced_and_mode_0600(small_daemon) -> None:
    mode = stat.S_IMODE(os.stat(small_daemon.socket).st_mode)
    assert mode == 0o600
    assert "removing stale socket" in small_daemon.log()


def test_live_socket_is_not_stolen(small_daemon) -> None:
    out = subprocess.run(
        [str(VENV_BIN / "umad"), "--socket", small_daemon.socket],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "another daemon" in out.stderr
    with small_daemon.client() as c:
        assert c.health().status == "ok"


@pytest.mark.parametrize("what", ["regular file", "directory", "missing parent"])
def test_socket_path_that_is_not_a_socket_is_left_alone(tmp_path, what: str) -> None:
    """Only a stale socket is removed; anything else is a clear error before the model loads."""
    path = tmp_path / "uma.sock"
    if what == "regular file":
        path.write_text("precious data")
    elif what == "directory":
        path.mkdir()
    else:
        path = tmp_path / "no-such-dir" / "uma.sock"
    out = subprocess.run(
        [str(VENV_BIN / "umad"), "--socket", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        out.returncode == 1 and str(path.parent if what == "missing parent" else path) in out.stderr
    )
    assert "loaded" not in out.stderr  # refused before the model loads
    if what == "regular file":
        assert path.read_text() == "precious data"
    elif what == "directory":
        assert path.is_dir()


def test_idle_connection_is_closed_with_error(small_daemon) -> None:
    s = raw_socket(small_daemon.socket, timeout=30)
    ev = read_event(s)
    assert isinstance(ev, p.ErrorEvent) and ev.code == p.E_IDLE
    assert read_event(s) is None
    s.close()


def test_client_that_never_reads_is_cancelled_others_keep_going(small_daemon) -> None:
    slow = raw_socket(small_daemon.socket, timeout=60)
    req = gen("Never read:", id="slow", max_tokens=1000, ignore_eos=True)
    slow.sendall(p.encode(req))
    # Flood the connection with answers it does not read: its write buffer passes the bound.
    slow.sendall(b"".join(p.encode(p.MetricsRequest(id=f"m{i}")) for i in range(400)))
    with small_daemon.client() as c:  # another client is served meanwhile
        done = c.complete(gen("Other client", max_tokens=5))
    assert done.usage.completion_tokens >= 1
    wait_idle(small_daemon)  # the slow request was cancelled and its sequence freed
    # a generation sent now is not computed and lost: the connection is closing
    with contextlib.suppress(OSError):
        slow.sendall(p.encode(gen("After the overflow", id="after", max_tokens=5)))
    events = read_until_closed(slow)  # ends: the daemon closed the connection
    errors = [e for e in events if isinstance(e, p.ErrorEvent)]
    assert [(e.id, e.code) for e in errors] == [("slow", p.E_IO)]
    assert "closing the connection" in errors[0].message
    assert not [e for e in events if getattr(e, "id", None) == "after"]
    slow.close()
    assert small_daemon.metrics()["kv_cells_used"] == 0


def test_admin_flood_without_reading_is_bounded_then_closed(small_daemon) -> None:
    """Admin answers count against --max-write-buffer-bytes like tokens: a client that asks
    for 20,000 metrics snapshots (~60 MB of answers) without reading gets E_IO_001 and EOF
    after a bounded number of bytes, and the daemon's queue for it is freed."""
    flood = b"".join(p.encode(p.MetricsRequest(id=f"m{i}")) for i in range(20000))
    log_at = len(small_daemon.log())  # an earlier test's overflow is logged there already
    s = raw_socket(small_daemon.socket, timeout=60)

    def send() -> None:
        with contextlib.suppress(OSError):  # the daemon stops reading once it closes
            s.sendall(flood)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    wait_for_log(small_daemon, "cancelling its requests, closing it", 120, since=log_at)
    events = read_until_closed(s)
    received = sum(len(p.encode(ev)) for ev in events)
    sender.join(60)
    s.close()
    assert isinstance(events[-1], p.ErrorEvent) and events[-1].code == p.E_IO
    assert events[-1].id is None  # nothing was in flight on it
    answered = sum(isinstance(e, p.MetricsEvent) for e in events)
    assert 0 < answered < 20000
    # the 64 KiB bound, plus what the kernel's socket buffers held and the answers to the
    # requests already read when the bound was passed (4-5 MB seen): far below 60 MB
    assert received < 8 << 20
    with small_daemon.client() as c:
        assert c.health().status == "ok"


@pytest.mark.slow
def test_a_closed_overflowed_connection_logs_nothing_after_the_grace(small_daemon) -> None:
    """The close deadline of an E_IO_001 connection that the client read to its end is
    cancelled: aborting the closed transport at the deadline logged a traceback."""
    log_at = len(small_daemon.log())
    s = raw_socket(small_daemon.socket, timeout=60)
    s.sendall(p.encode(gen("Never read:", id="slow", max_tokens=1000, ignore_eos=True)))
    s.sendall(b"".join(p.encode(p.MetricsRequest(id=f"m{i}")) for i in range(400)))
    wait_for_log(small_daemon, "cancelling its requests, closing it", 120, since=log_at)
    events = read_until_closed(s)  # everything queued, to the end: the transport closes
    s.close()
    assert [e.code for e in events if isinstance(e, p.ErrorEvent)] == [p.E_IO]
    time.sleep(CLOSE_GRACE_S + 2)  # past the deadline the daemon set at the overflow
    with small_daemon.client() as c:
        assert c.health().status == "ok"
    new_log = small_daemon.log()[log_at:]
    assert "Traceback" not in new_log and "Exception in callback" not in new_log, new_log


def test_sigterm_drain_timeout_cancels_with_detail(tmp_path) -> None:
    daemon = start_daemon(tmp_path, "--n-ctx", "2048", "--drain-timeout", "1")
    s = raw_socket(daemon.socket)
    s.sendall(p.encode(gen("A very long story:", id="long", max_tokens=2000, ignore_eos=True)))
    assert isinstance(read_event(s), p.TokenEvent)
    daemon.proc.send_signal(signal.SIGTERM)
    final = None
    while (ev := read_event(s)) is not None:
        if isinstance(ev, p.EosEvent):
            final = ev
    assert final is not None and final.reason == "cancelled"
    assert "shutting down (SIGTERM)" in final.detail and "drain timed out" in final.detail
    assert daemon.proc.wait(30) == 0
    assert not os.path.exists(daemon.socket)
    assert "Traceback" not in daemon.log()
    s.close()


def test_sigterm_drain_lets_running_requests_finish_and_refuses_new_ones(tmp_path) -> None:
    """The drain: running streams end normally, a new generation gets E_SHUTDOWN_001, health
    says draining; the daemon exits 0 once nothing is in flight; no traceback is logged."""
    daemon = start_daemon(tmp_path, "--n-ctx", "2048", "--drain-timeout", "300")
    s = raw_socket(daemon.socket)
    for i in range(3):
        s.sendall(p.encode(gen(f"Story {i}:", id=f"run{i}", max_tokens=60, ignore_eos=True)))
    assert isinstance(read_event(s), p.TokenEvent)
    daemon.proc.send_signal(signal.SIGTERM)
    wait_for_log(daemon, "draining")
    late = raw_socket(daemon.socket)  # new connections are still accepted during the drain
    late.sendall(p.encode(p.HealthRequest(id="h")))
    health = read_event(late)
    late.sendall(p.encode(gen("Too late", id="late")))
    refused = read_event(late)
    s.sendall(p.encode(gen("Too late too", id="late2")))
    finals: dict[str, p.Event] = {}
    while (ev := read_event(s)) is not None:
        if isinstance(ev, p.EosEvent | p.ErrorEvent):
            finals[ev.id] = ev
    assert isinstance(health, p.HealthEvent) and health.status == "draining"
    assert isinstance(refused, p.ErrorEvent) and refused.code == p.E_SHUTDOWN
    assert "shutting down" in refused.message
    assert isinstance(finals["late2"], p.ErrorEvent) and finals["late2"].code == p.E_SHUTDOWN
    for i in range(3):
        eos = finals[f"run{i}"]
        assert isinstance(eos, p.EosEvent) and eos.reason == "length"
        assert eos.usage.completion_tokens == 60
    assert daemon.proc.wait(60) == 0
    assert not os.path.exists(daemon.socket)
    assert "Traceback" not in daemon.log()
    s.close()
    late.close()


def test_second_sigterm_ends_the_drain_at_once(tmp_path) -> None:
    daemon = start_daemon(tmp_path, "--n-ctx", "2048", "--drain-timeout", "300")
    s = raw_socket(daemon.socket)
    s.sendall(p.encode(gen("A very long story:", id="long", max_tokens=2000, ignore_eos=True)))
    assert isinstance(read_event(s), p.TokenEvent)
    daemon.proc.send_signal(signal.SIGTERM)
    wait_for_log(daemon, "draining")
    daemon.proc.send_signal(signal.SIGTERM)
    final = None
    while (ev := read_event(s)) is not None:
        if isinstance(ev, p.EosEvent):
            final = ev
    assert final is not None and final.reason == "cancelled"
    assert "second signal" in final.detail and final.usage.completion_tokens < 2000
    assert daemon.proc.wait(30) == 0
    assert "Traceback" not in daemon.log()
    s.close()


def test_sigint_with_no_clients_exits_zero(tmp_path) -> None:
    daemon = start_daemon(tmp_path, "--n-ctx", "2048")
    assert daemon.stop(signal.SIGINT) == 0
    assert not os.path.exists(daemon.socket)


def test_missing_model_file_is_a_clear_error(tmp_path) -> None:
    out = subprocess.run(
        [str(VENV_BIN / "umad"), "--socket", str(tmp_path / "s"), "--model", "/nope.gguf"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "model file not found" in out.stderr
