"""Daemon lifecycle: socket ownership and mode, SIGTERM drain, idle timeout, slow readers."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import time

import pytest

from uma_serve.core import protocol as p

from .helpers import VENV_BIN, gen, raw_socket, read_event, start_daemon, wait_idle


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
    slow.sendall(
        b"".join(p.encode(p.MetricsRequest(type="metrics", id=f"m{i}")) for i in range(400))
    )
    with small_daemon.client() as c:  # another client is served meanwhile
        done = c.complete(gen("Other client", max_tokens=5))
    assert done.usage.completion_tokens >= 1
    wait_idle(small_daemon)  # the slow request was cancelled and its sequence freed
    seen_error = None
    while (ev := read_event(slow)) is not None:
        if isinstance(ev, p.ErrorEvent) and ev.id == "slow":
            seen_error = ev
            break
    assert seen_error is not None and seen_error.code == p.E_IO
    slow.close()


def test_sigterm_drains_and_removes_socket(tmp_path) -> None:
    daemon = start_daemon(tmp_path, "--n-ctx", "2048")
    s = raw_socket(daemon.socket)
    s.sendall(p.encode(gen("A very long story:", id="long", max_tokens=1000, ignore_eos=True)))
    assert isinstance(read_event(s), p.TokenEvent)
    t0 = time.monotonic()
    daemon.proc.send_signal(signal.SIGTERM)
    final = None
    while (ev := read_event(s)) is not None:
        if isinstance(ev, p.EosEvent):
            final = ev
    assert final is not None and final.reason == "cancelled" and "shutting down" in final.detail
    assert daemon.proc.wait(30) == 0
    assert time.monotonic() - t0 < 30
    assert not os.path.exists(daemon.socket)
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
