"""uma-gateway's --log-format: text keeps uvicorn's own lines; json gives uvicorn's lines and
the gateway's (uma.*) the JSON objects umad writes (core/logfmt.py), with the request id of the
request a line was logged for."""

from __future__ import annotations

from typing import Any

import uvicorn.config

from uma_serve.core.logfmt import FORMATS

LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uma")


def log_config(fmt: str, level: str) -> dict[str, Any]:
    """uvicorn's ``log_config`` for --log-format ``fmt`` at --log-level ``level``."""
    if fmt not in FORMATS:
        raise ValueError(f"--log-format must be one of {', '.join(FORMATS)}")
    if fmt == "text":
        return uvicorn.config.LOGGING_CONFIG
    handler = {
        "class": "logging.StreamHandler",
        "formatter": "json",
        "filters": ["request_id"],
        "stream": "ext://sys.stderr",
    }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "uma_serve.core.logfmt.JsonFormatter"}},
        "filters": {"request_id": {"()": "uma_serve.gateway.request_id.RequestIdFilter"}},
        "handlers": {"json": handler},
        "loggers": {
            name: {"handlers": ["json"], "level": level.upper(), "propagate": False}
            for name in LOGGERS
        },
    }
