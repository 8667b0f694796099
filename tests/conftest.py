"""Shared fixtures: a real umad subprocess on the embedded default model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from uma_serve.clients import UmaClient

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


def start_daemon(tmp: Path, *args: str, env: dict[str, str] | None = None) -> Daemon:
    """Start umad on a socket in ``tmp`` and wait until it answers a health request."""
    socket_path = str(tmp / "uma.sock")
    log_path = tmp / "umad.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [str(VENV_BIN / "umad"), "--socket", socket_path, *args],
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


@pytest.fixture(scope="session")
def umad() -> Iterator[Daemon]:
    """One daemon for the session: default model, 4 sequences, small limits for bad-input tests."""
    with tempfile.TemporaryDirectory(prefix="uma-test-") as tmp:
        daemon = start_daemon(
            Path(tmp),
            "--n-seq", "4",
            "--n-ctx", "4096",
            "--max-sessions", "16",
            "--max-prompt-bytes", "20000",
            "--max-tokens", "512",
            "--seed", "1234",
        )  # fmt: skip
        yield daemon
        daemon.stop()


@pytest.fixture
def fresh_tmp() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="uma-test-") as tmp:
        yield Path(tmp)
