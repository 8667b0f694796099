"""Small helpers for integration tests against a real umad."""

from __future__ import annotations

import socket
import time
from typing import Any

from uma_serve.clients.client import new_id
from uma_serve.core import protocol as p


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
