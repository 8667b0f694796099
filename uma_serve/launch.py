"""`make run`: start umad, then uma-gateway once the core's socket answers; stop both together.

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

DEFAULT_SOCKET = os.environ.get("UMA_SOCKET", "/tmp/uma.sock")  # umad's and uma-cli's default


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
    ap = argparse.ArgumentParser(
        prog="python -m uma_serve.launch",
        description="Run umad and uma-gateway together; extra args after -- go to umad.",
    )
    ap.add_argument("--socket", default=DEFAULT_SOCKET, help="core socket (env UMA_SOCKET)")
    ap.add_argument("--host", default=os.environ.get("UMA_HOST", "127.0.0.1"))
    ap.add_argument("--port", type=int, default=int(os.environ.get("UMA_PORT", "8000")))
    ap.add_argument("--startup-timeout", type=float, default=180.0)
    ap.add_argument("umad_args", nargs="*", help="extra umad arguments (after --)")
    args = ap.parse_args(argv)

    py = sys.executable
    core = subprocess.Popen(
        [py, "-m", "uma_serve.core.daemon", "--socket", args.socket, *args.umad_args],
        start_new_session=True,
    )
    children = [core]
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)

    deadline = time.monotonic() + args.startup_timeout
    while not socket_answers(args.socket):
        if core.poll() is not None or received or time.monotonic() > deadline:
            stop(core)
            print("launch: umad did not come up", file=sys.stderr)
            return core.returncode or 1
        time.sleep(0.2)

    gateway = subprocess.Popen(
        [
            py, "-m", "uma_serve.gateway.main",
            "--core-socket", args.socket, "--host", args.host, "--port", str(args.port),
        ],
        start_new_session=True,
    )  # fmt: skip
    children.append(gateway)
    print(f"launch: core on {args.socket}, gateway on http://{args.host}:{args.port}/v1")

    code = 0
    while not received:
        exited = [c for c in children if c.poll() is not None]
        if exited:
            code = exited[0].returncode
            name = "umad" if exited[0] is core else "uma-gateway"
            print(f"launch: {name} exited with {code}; stopping the other", file=sys.stderr)
            break
        time.sleep(0.2)
    sig = received[0] if received else signal.SIGTERM
    stop(gateway, sig)  # the gateway first: its streams end before the core drains
    stop(core, sig)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
