"""OpenAI-shaped errors: one exception type, one JSON shape, one mapping from core codes.

Every failure the gateway reports leaves as ``{"error": {"message", "type", "param", "code"}}``
with the HTTP status the OpenAI SDK turns into its matching exception class.
"""

from __future__ import annotations

import logging
import uuid

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from uma_serve.clients.client import E_BAD_REPLY, E_TOO_BIG, CoreError
from uma_serve.core import protocol as p

RETRY_AFTER_S = 1
E_CONNECT = "E_CONNECT"  # the gateway could not reach the core socket at all
log = logging.getLogger("uma.gateway")


class ApiError(Exception):
    """An error answer: raised anywhere in a route, rendered by the app's handler."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def unavailable(message: str, code: str) -> ApiError:
    """Every 503 the gateway gives: a server error a client retries after ``Retry-After``."""
    return ApiError(503, message, type="server_error", code=code,
                    headers={"Retry-After": str(RETRY_AFTER_S)})  # fmt: skip


def core_unavailable(reason: str) -> ApiError:
    return unavailable(f"the inference core is unavailable: {reason}", "core_unavailable")


def shutting_down(what: str = "the request was stopped") -> ApiError:
    """The gateway's own shutdown (gateway/drain.py)."""
    return unavailable(
        f"the gateway is shutting down: {what}; retry on another instance or later",
        "shutting_down",
    )


def core_timeout(seconds: float) -> ApiError:
    """A stream whose first event did not come within ``--first-event-timeout``."""
    return unavailable(
        f"the inference core sent nothing within {seconds:g} s (--first-event-timeout)",
        "core_timeout",
    )


def too_many_requests(message: str) -> ApiError:
    return ApiError(
        429,
        message,
        type="rate_limit_error",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def from_core_error(exc: CoreError, prompt_param: str = "prompt") -> ApiError:
    """Map a core error code to the HTTP status the issue's table gives it."""
    code, msg = exc.code, exc.message
    if code == p.E_LIMIT:
        return ApiError(400, msg, param=prompt_param, code="context_length_exceeded")
    if code == p.E_LIMIT_TOKENS:
        return ApiError(400, msg, param="max_tokens", code="invalid_value")
    if code == p.E_TEMPLATE:
        return ApiError(400, msg, param=prompt_param, code="invalid_value")
    if code == p.E_MODEL:
        return ApiError(400, msg, param=prompt_param, code="model_not_supported")
    if code == p.E_PROTO and "'grammar'" in msg:  # a completion's own, or built from these
        param = "grammar" if prompt_param == "prompt" else "response_format"
        return ApiError(400, msg, param=param, code="invalid_value")
    if code == E_TOO_BIG:  # the client library refused to send it (clients/client.py)
        return ApiError(400, msg, param=prompt_param, code="request_too_large")
    if code in (p.E_PROTO, p.E_DUP_ID):
        return ApiError(400, msg, code="invalid_request")
    if code == p.E_BUSY:
        return too_many_requests(msg)
    if code == p.E_SHUTDOWN:
        return unavailable(f"the inference core is unavailable: {msg}", "shutting_down")
    if code in (p.E_IO, p.E_FRAME, p.E_IDLE, E_CONNECT):
        return core_unavailable(msg)
    if code == E_BAD_REPLY:  # the core's fault, not the client's: details to the log
        log.error("bad reply from the core: %s", msg)
        return ApiError(502, "the core sent a reply the gateway cannot read", type="server_error",
                        code="bad_core_reply")  # fmt: skip
    return ApiError(500, msg, type="server_error", code=code)


def over_limit(refusal: p.Refusal, params: dict[str, str]) -> ApiError:
    """A request over the core's limits (``protocol.over_limits``, checked here before it is
    sent), naming the request's own field: ``params`` maps the core's field names to it."""
    code = "context_length_exceeded" if refusal.code == p.E_LIMIT else "invalid_value"
    return ApiError(400, refusal.message, param=params.get(refusal.field, refusal.field), code=code)


async def api_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return exc.response()


async def http_exception_handler(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 and friends, in OpenAI's shape."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404 and (moved := _without_slash(request)):
        return Response(status_code=307, headers={"Location": moved})
    if exc.status_code == 404:
        msg = f"unknown route {request.method} {request.url.path}"
        return ApiError(404, msg, code="not_found").response()
    if exc.status_code == 405:
        msg = f"method {request.method} not allowed on {request.url.path}"
        return ApiError(405, msg, code="method_not_allowed").response()
    return ApiError(exc.status_code, str(exc.detail)).response()


def _without_slash(request: Request) -> str | None:
    """For a known route asked with a trailing slash: where it is, as a relative reference
    (only ever one of the app's own paths: never another host's)."""
    path = request.url.path
    if not path.endswith("/") or (bare := path.rstrip("/")) not in request.app.state.known_paths:
        return None
    query = request.url.query
    return f"{bare}?{query}" if query else bare


async def unhandled_handler(request: Request, exc: Exception) -> Response:
    """Last resort: a bug in the gateway is a 500 error object, not a dropped connection.
    The client gets the request id only; the log line names it before the traceback that
    uvicorn logs (Starlette re-raises the exception after this answer)."""
    rid = request_id_of(request)
    log.error("internal error on %s %s, request id %s: %s", request.method,
              request.url.path, rid, type(exc).__name__)  # fmt: skip
    msg = f"internal gateway error (request id {rid}): the gateway's log has the details"
    err = ApiError(500, msg, type="server_error", code="internal_error")
    err.headers["X-Request-Id"] = rid
    return err.response()


def request_id_of(request: Request) -> str:
    """The id the route gave the request, else the caller's X-Request-Id, else a fresh one
    (as gateway/request_id.py puts on the answer)."""
    rid = getattr(request.state, "request_id", None)
    given = request.headers.get("x-request-id", "")
    if not rid and given.isascii() and given.isprintable():
        rid = given[:200]
    return rid or f"req-{uuid.uuid4().hex}"
