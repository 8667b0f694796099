"""Gateway helpers: the real uma-gateway started under uvicorn on a free port, and the core's
metrics read over its socket. The session's gateways are fixtures in conftest.py."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from openai import OpenAI

from uma_serve.clients.client import AsyncUmaClient

VENV_BIN = Path(sys.executable).parent
API_KEYS = ("test-key-one", "test-key-two")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Gateway:
    url: str
    proc: subprocess.Popen
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def client(self, api_key: str = "none", **kw) -> OpenAI:
        return OpenAI(base_url=self.base_url, api_key=api_key, max_retries=0, **kw)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_gateway(
    core_socket: str, *args: str, log_dir: Path | None = None, wrap: Sequence[str] = ()
) -> Gateway:
    """Start uma-gateway as a process and wait until it answers HTTP (any status); ``wrap``
    is a command that runs it (e.g. a sandbox)."""
    port = free_port()
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="uma-gw-"))
    log_path = log_dir / f"gateway-{port}.log"
    proc = subprocess.Popen(
        [
            *wrap,
            str(VENV_BIN / "uma-gateway"),
            "--core-socket", core_socket, "--port", str(port), "--log-level", "warning", *args,
        ],
        stdout=log_path.open("w"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    gw = Gateway(f"http://127.0.0.1:{port}", proc, log_path)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"uma-gateway exited with {proc.returncode}:\n{gw.log()}")
        try:
            httpx.get(f"{gw.url}/health", timeout=2)
            return gw
        except httpx.TransportError:
            time.sleep(0.1)
    gw.stop()
    raise RuntimeError(f"uma-gateway did not start:\n{gw.log()}")


def core_metrics(socket_path: str) -> dict:
    async def get() -> dict:
        client = await AsyncUmaClient.connect(socket_path)
        try:
            return await client.metrics()
        finally:
            await client.close()

    return asyncio.run(get())


def wait_idle(socket_path: str, timeout: float = 20.0) -> dict:
    """Poll the core until no request runs or waits; return that snapshot (or the last)."""
    deadline = time.monotonic() + timeout
    while True:
        m = core_metrics(socket_path)
        if m["active_sessions"] == 0 and m["waiting_sessions"] == 0:
            return m
        if time.monotonic() > deadline:
            return m
        time.sleep(0.1)
