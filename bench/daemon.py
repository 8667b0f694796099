"""Start and stop a umad subprocess for a bench run (its own socket in a temp folder)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from uma_serve.clients import UmaClient

BIN = Path(sys.executable).parent


class BenchDaemon:
    def __init__(self, *args: str, log_dir: Path | None = None) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="uma-bench-")
        self.socket = os.path.join(self._tmp.name, "uma.sock")
        log_path = (log_dir or Path(self._tmp.name)) / "umad.log"
        self._log = open(log_path, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [str(BIN / "umad"), "--socket", self.socket, *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 180
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"umad exited ({self.proc.returncode}); log: {log_path}")
            try:
                with UmaClient(self.socket, timeout=5) as c:
                    c.health()
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.proc.kill()
                    raise RuntimeError("umad did not start in 180 s") from None
                time.sleep(0.2)

    def metrics(self) -> dict:
        with UmaClient(self.socket, timeout=30) as c:
            return c.metrics()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()
        self._tmp.cleanup()

    def __enter__(self) -> BenchDaemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
