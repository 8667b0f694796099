"""--log-format json: the real umad and uma-gateway write one JSON object a line (jq reads
them) through a normal request, an error and a drain on SIGTERM, with the request id and the
core on the lines that concern them."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
from pathlib import Path

import openai
import pytest

from .gateway_helpers import start_gateway
from .helpers import start_daemon

pytestmark = pytest.mark.integration
KEYS = {"time", "level", "logger", "message"}


def json_lines(path: Path) -> list[dict]:
    """Every line of ``path`` as JSON: by jq (as an operator's pipeline reads it) and here."""
    text = path.read_text()
    jq = shutil.which("jq")
    assert jq, "jq is missing: `make install` installs Debian's jq"
    subprocess.run([jq, "-e", "-c", ".time and .level and .logger"], input=text, text=True,
                   check=True, capture_output=True)  # fmt: skip
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines and all(line.keys() >= KEYS for line in lines), text
    return lines


def test_json_logs_through_a_request_an_error_and_a_drain(tmp_path: Path) -> None:
    core = start_daemon(tmp_path, "--log-format", "json", "--max-prompt-bytes", "200")
    gw = start_gateway(core.socket, "--log-format", "json", "--log-level", "info", "--access-log",
                       log_dir=tmp_path)  # fmt: skip
    try:
        sdk = gw.client()
        model = sdk.models.list().data[0].id
        ok = sdk.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        with pytest.raises(openai.BadRequestError):
            sdk.completions.create(model=model, prompt="x" * 300, max_tokens=4)
        stream = sdk.completions.create(model=model, prompt="Count:", max_tokens=48, stream=True)
        next(iter(stream))  # a request in flight when the drain starts
        gw.proc.send_signal(signal.SIGTERM)
        core.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(openai.APIError):  # finished, or cut at --shutdown-grace
            for _ in stream:
                pass
        assert core.proc.wait(60) == 0
        assert gw.proc.wait(60) in (0, -signal.SIGTERM)  # uvicorn ends by its signal
    finally:
        gw.stop()
        core.stop(signal.SIGKILL)

    umad = json_lines(core.log_path)
    assert all(line["core"] == core.socket for line in umad)
    assert any("draining" in line["message"] and line["level"] == "info" for line in umad)
    assert umad[-1]["message"] == "umad stopped"

    gateway = json_lines(gw.log_path)
    access = {line["request_id"]: line for line in gateway if line["logger"] == "uvicorn.access"}
    assert access[ok.id]["status"] == 200 and access[ok.id]["method"] == "POST"
    assert access[ok.id]["path"] == "/v1/chat/completions"
    assert [line["status"] for line in access.values()].count(400) == 1
    assert any(line["message"].startswith("Shutting down") for line in gateway)
    assert not any("\x1b" in str(v) for line in gateway for v in line.values())  # no colours
