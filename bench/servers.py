"""Launch the servers a bench drives, all with the same model and shape.

ServerShape is what every server gets: the same GGUF, threads, total context, batch/ubatch and
parallel sequences. `launch(kind, shape, log_dir)` is a context manager yielding a Target:
- `uma`: umad + uma-gateway, driven over HTTP/SSE (comparable with the peers),
- `uma-socket`: umad alone, driven over its socket with the client library,
- `llama-server` and `batched`: the peers (built and cached by peers_build).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from uma_serve.bench import peers_build
from uma_serve.bench.daemon import BenchDaemon
from uma_serve.bench.targets import HttpTarget, SocketTarget, Target

BIN = Path(sys.executable).parent
KINDS = ("uma", "uma-socket", "llama-server", "batched")


class ServerUnavailable(RuntimeError):
    """The server cannot be run here (peer not built, failed to start)."""


@dataclass
class ServerShape:
    model: str
    n_seq: int = 4
    n_ctx: int = 8192  # total, shared by the sequences
    n_batch: int = 512
    n_ubatch: int = 512
    threads: int = 0  # 0 = all cores
    n_gpu_layers: int = 0  # -1 = all (a GPU build of llama.cpp)
    umad_args: list[str] = field(default_factory=list)

    @property
    def n_threads(self) -> int:
        return self.threads or os.cpu_count() or 1

    def umad_flags(self) -> list[str]:
        return [
            "--model", self.model, "--n-seq", str(self.n_seq), "--n-ctx", str(self.n_ctx),
            "--n-batch", str(self.n_batch), "--n-ubatch", str(self.n_ubatch),
            "--threads", str(self.n_threads), "--n-gpu-layers", str(self.n_gpu_layers),
            *self.umad_args,
        ]  # fmt: skip

    def llama_server_cmd(self, binary: str, port: int) -> list[str]:
        return [
            binary, "-m", self.model, "-c", str(self.n_ctx), "-np", str(self.n_seq),
            "-b", str(self.n_batch), "-ub", str(self.n_ubatch),
            "-t", str(self.n_threads), "-tb", str(self.n_threads),
            "-ngl", str(self.n_gpu_layers),
            "--kv-unified", "--no-repack", "--no-webui",
            "--host", "127.0.0.1", "--port", str(port),
        ]  # fmt: skip

    def batched_config(self, port: int) -> dict:
        return {
            "server": {"host": "127.0.0.1", "port": port},
            "model": {
                "path": self.model,
                "alias": Path(self.model).stem,
                "n_ctx": self.n_ctx,
                "n_seq_max": self.n_seq,
                "n_batch": self.n_batch,
                "n_ubatch": self.n_ubatch,
                "threads": self.n_threads,
                "threads_batch": self.n_threads,
                "n_gpu_layers": self.n_gpu_layers,
                "kv_unified": True,
                "store_logits": False,
            },
        }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerUnavailable(f"exited with {proc.returncode}; log: {log}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise ServerUnavailable(f"not ready after {timeout:.0f} s; log: {log}")


@contextlib.contextmanager
def _process(cmd: list[str], log: Path, url: str) -> Iterator[subprocess.Popen]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        out.write(" ".join(cmd) + "\n\n")
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_http(url, proc, log)
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@contextlib.contextmanager
def gateway(core_socket: str, log: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(BIN / "uma-gateway"), "--port", str(port), "--core-socket", core_socket]
    with _process(cmd, log, url) as proc:
        yield url, proc


def command_lines(kind: str, shape: ServerShape) -> list[str]:
    """The exact command lines (port placeholder) for docs and summaries."""
    if kind in ("uma", "uma-socket"):
        lines = ["umad --socket SOCK " + " ".join(shape.umad_flags())]
        if kind == "uma":
            lines.append("uma-gateway --port PORT --core-socket SOCK")
        return lines
    if kind == "llama-server":
        return [" ".join(shape.llama_server_cmd(str(peers_build.llama_server_bin()), 0))]
    cfg = json.dumps(shape.batched_config(0))
    return [f"{peers_build.batched_python()} {peers_build.batched_script()} -C CFG  # {cfg}"]


@contextlib.contextmanager
def launch(kind: str, shape: ServerShape, log_dir: Path) -> Iterator[Target]:
    """Start one server of `kind`, yield a Target driving it, stop it afterwards."""
    log_dir.mkdir(parents=True, exist_ok=True)
    if kind in ("uma", "uma-socket"):
        with BenchDaemon(*shape.umad_flags(), log_dir=log_dir) as daemon:
            if kind == "uma-socket":
                yield SocketTarget(daemon.socket, name="uma-socket")
                return
            with gateway(daemon.socket, log_dir / "gateway.log") as (url, _):
                yield HttpTarget(url, name="uma", send_qos=True)
        return
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if kind == "llama-server":
        binary = peers_build.llama_server_bin()
        if not binary.exists():
            raise ServerUnavailable(
                f"llama-server not built ({binary}); run: python -m uma_serve.bench.peers_build"
            )
        cmd = shape.llama_server_cmd(str(binary), port)
        with _process(cmd, log_dir / "llama-server.log", url):
            yield HttpTarget(url, name="llama-server")
        return
    if kind == "batched":
        py, script = peers_build.batched_python(), peers_build.batched_script()
        if not (py.parent.parent / ".uma-ready").exists() or not script.exists():
            raise ServerUnavailable(
                "batched server venv not ready; run: python -m uma_serve.bench.peers_build"
            )
        cfg = log_dir / "batched-config.json"
        cfg.write_text(json.dumps(shape.batched_config(port), indent=2))
        with _process([str(py), str(script), "-C", str(cfg)], log_dir / "batched.log", url):
            # no ignore_eos, no usage in its stream: lengths may vary, tokens = chunks
            yield HttpTarget(url, name="batched", send_ignore_eos=False, send_usage=False)
        return
    raise ValueError(f"unknown server kind {kind!r}; one of {KINDS}")
