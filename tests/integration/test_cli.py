"""uma-cli against the real daemon: output and the documented exit codes."""

from __future__ import annotations

import json
import subprocess

from .helpers import VENV_BIN


def cli(umad_socket: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "uma-cli"), "--socket", umad_socket, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_prompt_streams_an_answer(umad) -> None:
    out = cli(umad.socket, "--prompt", "The capital of France is", "--max-tokens", "6")
    assert out.returncode == 0 and out.stdout.strip(), out.stderr


def test_stdin_chat_no_stream_with_usage(umad) -> None:
    out = cli(umad.socket, "--chat", "--no-stream", "--usage", "--max-tokens", "4", stdin="Hi")
    assert out.returncode == 0, out.stderr
    usage = json.loads(out.stderr.strip().splitlines()[-1])
    assert usage["usage"]["completion_tokens"] <= 4 and usage["reason"] in ("stop", "length")
    assert "base model" in out.stderr  # the embedded GGUF carries no chat template of its own


def test_info_and_metrics_are_json(umad) -> None:
    info = json.loads(cli(umad.socket, "--info").stdout)
    assert info["n_seq"] == 4 and info["chat_template"] is True
    assert info["gguf_chat_template"] is False  # the shipped Gemma 3 template serves it
    assert "decode_ms_ewma" in json.loads(cli(umad.socket, "--metrics").stdout)


def test_server_error_exits_2(umad) -> None:
    out = cli(umad.socket, "--prompt", "x" * 30000)  # over --max-prompt-bytes 20000
    assert out.returncode == 2 and "E_LIMIT_001" in out.stderr


def test_protocol_error_exits_3(umad) -> None:
    out = cli(umad.socket, "--prompt", "hi", "--max-tokens", "0")
    assert out.returncode == 3 and "E_PROTO_001" in out.stderr


def test_unreachable_daemon_exits_2(tmp_path) -> None:
    out = cli(str(tmp_path / "nobody.sock"), "--prompt", "hi")
    assert out.returncode == 2 and "cannot reach" in out.stderr
