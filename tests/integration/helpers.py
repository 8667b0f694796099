"""Small helpers for integration tests against a real umad."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uma_serve.clients import UmaClient
from uma_serve.clients.client import new_id
from uma_serve.core import protocol as p

VENV_BIN = Path(sys.executable).parent


@dataclass
class Daemon:
    socket: str
    proc: subprocess.Popen
    log_path: Path

    def client(self, timeout: float | None = 120) -> UmaClient:
        return UmaClient(self.socket, timeout=timeout)

    def metrics(self) -> dict:
        with self.client() as c:
            return c.metrics()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def start_daemon(
    tmp: Path, *args: str, env: dict[str, str] | None = None, wrap: Sequence[str] = ()
) -> Daemon:
    """Start umad on a socket in ``tmp`` and wait until it answers a health request; ``wrap``
    is a command that runs it (e.g. a sandbox)."""
    socket_path = str(tmp / "uma.sock")
    log_path = tmp / "umad.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [*wrap, str(VENV_BIN / "umad"), "--socket", socket_path, *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    daemon = Daemon(socket_path, proc, log_path)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"umad exited with {proc.returncode}:\n{daemon.log()}")
        try:
            with daemon.client(timeout=5) as c:
                c.health()
            return daemon
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"umad did not start within 120 s:\n{daemon.log()}")


def gen(prompt: str = "Write a story about a cat.", **kw: Any) -> p.Generate:
    kw.setdefault("max_tokens", 8)
    kw.setdefault("temperature", 0.0)
    return p.Generate(id=kw.pop("id", None) or new_id(), prompt=prompt, **kw)


def raw_socket(path: str, timeout: float = 60) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    return s


def read_event(s: socket.socket) -> p.Event | None:
    """Read one event from a raw socket; None at EOF."""
    header = _exactly(s, 4)
    if header is None:
        return None
    (n,) = p.HEADER.unpack(header)
    body = _exactly(s, n)
    return None if body is None else p.decode_event(body)


def read_until_closed(s: socket.socket) -> list[p.Event]:
    """Every event until the daemon closes the connection. A reset counts as the close: the
    daemon closed with requests of ours unread (the kernel delivers its data first)."""
    events: list[p.Event] = []
    try:
        while (ev := read_event(s)) is not None:
            events.append(ev)
    except ConnectionResetError:
        pass
    return events


def _exactly(s: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def frame(payload: bytes) -> bytes:
    return p.HEADER.pack(len(payload)) + payload


def wait_idle(daemon: Any, timeout: float = 60) -> dict:
    """Poll the metrics until no sequence is active or waiting; return the last snapshot."""
    deadline = time.monotonic() + timeout
    while True:
        m = daemon.metrics()
        if m["active_sessions"] == 0 and m["waiting_sessions"] == 0:
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"sequences still held after {timeout} s: {m}")
        time.sleep(0.1)
