"""deploy/umad.service and deploy/uma-gateway.service: the real umad and gateway under the
system-call sandbox their units ask systemd for (unit_seccomp.py: MemoryDenyWriteExecute,
RestrictAddressFamilies, SystemCallFilter). A library that needs writable and executable
memory (a JIT) or a system call outside the filter fails here, not on a deployed host."""

from __future__ import annotations

import ctypes.util
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from uma_serve.core import protocol as p

from .gateway_helpers import start_gateway
from .helpers import gen, start_daemon

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SANDBOX = [sys.executable, str(Path(__file__).with_name("unit_seccomp.py"))]
pytestmark = pytest.mark.skipif(
    not shutil.which("systemd-analyze") or not ctypes.util.find_library("seccomp"),
    reason="needs systemd-analyze (system-call groups) and libseccomp",
)

PROBE = """
import mmap, socket
try:
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    print("wx mapped")
except OSError:
    print("wx refused")
for family in (socket.AF_INET, socket.AF_NETLINK):
    try:
        socket.socket(family).close()
        print(family.name, "allowed")
    except OSError:
        print(family.name, "refused")
"""


def sandbox(unit: str) -> list[str]:
    return [*SANDBOX, str(DEPLOY / unit), "--"]


def test_the_sandbox_enforces_the_units_settings() -> None:
    run = [*sandbox("umad.service"), sys.executable, "-c", PROBE]
    out = subprocess.run(run, capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:3] == ["wx refused", "AF_INET refused", "AF_NETLINK refused"]
    run = [*sandbox("uma-gateway.service"), sys.executable, "-c", PROBE]
    out = subprocess.run(run, capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:3] == ["wx refused", "AF_INET allowed", "AF_NETLINK refused"]


def test_umad_and_the_gateway_serve_inside_their_units_sandbox(fresh_tmp: Path) -> None:
    daemon = start_daemon(fresh_tmp, "--n-seq", "2", wrap=sandbox("umad.service"))
    gateway = None
    try:
        with daemon.client() as c:
            text = c.complete(gen("The capital of France is", stream=False, max_tokens=12))
            assert text.reason == "length" and text.text
            # prompt-lookup drafts, logprobs, llama.cpp's grammar sampler, the chat template
            counting = "1 2 3 4 5 6 7 8 9 10 " * 3
            drafted = c.complete(gen(counting, stream=False, max_tokens=16, logprobs=2))
            assert len(drafted.logprobs or []) == 16
            choice = c.complete(gen("Yes or no?", stream=False, grammar='root ::= "yes" | "no"'))
            assert choice.text in ("yes", "no") and choice.reason == "stop"
            hello = [p.Message("user", "Say hello.")]
            chat = c.complete(p.Generate(id="chat", messages=hello, max_tokens=4, stream=False))
            assert chat.usage.completion_tokens > 0
        gateway = start_gateway(daemon.socket, wrap=sandbox("uma-gateway.service"))
        body = {"prompt": "Once upon a time", "max_tokens": 8, "stream": True}
        with httpx.stream("POST", f"{gateway.url}/v1/completions", json=body, timeout=60) as r:
            chunks = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert r.status_code == 200 and chunks[-1] == "data: [DONE]" and len(chunks) > 2
        assert httpx.get(f"{gateway.url}/health", timeout=30).json()["status"] == "ok"
        assert "uma_" in httpx.get(f"{gateway.url}/metrics", timeout=30).text
    finally:
        if gateway is not None:
            gateway.stop()
            assert gateway.proc.returncode in (0, -signal.SIGTERM), gateway.log()  # uvicorn's
        assert daemon.stop() == 0, daemon.log()  # the drain on SIGTERM, inside the sandbox
    assert "Traceback" not in daemon.log()
