"""--log-format for umad and uma-gateway: text (one line for a person, the default) or json (one
JSON object a line, for journald, Loki or Elasticsearch to filter on fields instead of parsing
prose). Shared by both programs so their lines carry the same keys: time, level, logger,
message, and each field a log call passes in ``extra`` (request_id, core, ...)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

FORMATS = ("text", "json")
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# a LogRecord's own attributes: everything else on a record came from a log call's `extra`
# (and uvicorn's color_message: the message again, with terminal colour codes)
_OWN = set(vars(logging.LogRecord("", 0, "", 0, "", None, None)))
_OWN |= {"message", "asctime", "color_message"}
# uvicorn's access line "%s - "%s %s HTTP/%s" %d": its arguments as fields
_ACCESS = ("client", "method", "path", "http_version", "status")


class JsonFormatter(logging.Formatter):
    """One JSON object a line; ``fields`` go on every line (e.g. umad's core socket)."""

    def __init__(self, fields: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.fields = dict(fields or {})

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        out: dict[str, Any] = {
            "time": when.replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **self.fields,
        }
        out.update((k, v) for k, v in vars(record).items() if k not in _OWN and k[0] != "_")
        if record.name == "uvicorn.access" and isinstance(record.args, tuple):
            out.update(zip(_ACCESS, record.args, strict=False))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def formatter(fmt: str, fields: dict[str, Any] | None = None) -> logging.Formatter:
    """The formatter of --log-format ``fmt`` (text: the default line, unchanged)."""
    if fmt == "json":
        return JsonFormatter(fields)
    if fmt == "text":
        return logging.Formatter(TEXT)
    raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")


def setup(level: str, fmt: str, fields: dict[str, Any] | None = None) -> None:
    """The root logger writes to stderr at ``level`` in ``fmt``."""
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(fmt, fields))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
