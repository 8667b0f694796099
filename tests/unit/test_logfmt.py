"""core/logfmt.py: the JSON line's keys, a log call's fields, uvicorn's access line as
fields, and the text line left as it was."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from uma_serve.core import config as cfg
from uma_serve.core.logfmt import TEXT, formatter


def record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    r = logging.LogRecord("uma.test", logging.WARNING, __file__, 1, msg, args or None, None)
    r.__dict__.update(extra)
    return r


def test_json_line_has_the_keys_and_the_fields_of_the_call() -> None:
    line = formatter("json", {"core": "/run/uma/uma.sock"}).format(
        record("core %s down", "a", request_id="chatcmpl-1", color_message="\x1b[1m")
    )
    out = json.loads(line)
    assert out.pop("time").endswith("Z")
    assert out == {
        "level": "warning",
        "logger": "uma.test",
        "message": "core a down",
        "core": "/run/uma/uma.sock",
        "request_id": "chatcmpl-1",
    }


def test_json_access_line_and_exception() -> None:
    r = record('%s - "%s %s HTTP/%s" %d', "127.0.0.1:9", "POST", "/v1/completions", "1.1", 400)
    r.name = "uvicorn.access"
    out = json.loads(formatter("json").format(r))
    assert (out["method"], out["path"], out["status"]) == ("POST", "/v1/completions", 400)
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        r = record("failed")
        r.exc_info = sys.exc_info()
    line = formatter("json").format(r)
    assert "\n" not in line and "ValueError: boom" in json.loads(line)["exception"]


def test_text_is_the_old_line_and_a_bad_format_is_refused() -> None:
    assert formatter("text")._fmt == TEXT == "%(asctime)s %(levelname)s %(name)s: %(message)s"
    with pytest.raises(ValueError, match="text, json"):
        formatter("yaml")


def test_umad_refuses_an_unknown_log_format() -> None:
    assert cfg.load(["--log-format", "json"], environ={}).log_format == "json"
    with pytest.raises(ValueError, match="log_format must be one of text, json"):
        cfg.load([], environ={"UMA_LOG_FORMAT": "yaml"})
