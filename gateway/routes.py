"""The generation routes: completions and chat completions (the others: gateway/info_routes.py).

Each generation route: refuse a body that is not JSON (415: a page's form or text/plain POST
needs no CORS preflight), read the body under the size limit (413) and its deadline (408),
take an in-flight slot (429 beyond --max-inflight; a slow body holds none), validate it in one
step (400), check it against the core's info (404 for an unknown model, 400 for max_tokens,
prompt size or a logit_bias token outside the vocabulary), then run it through the core.
While the gateway shuts down, new ones get 503 (gateway/drain.py).
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import Callable
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from uma_serve.clients.client import CoreError
from uma_serve.core import protocol as p
from uma_serve.gateway import choices, lenient, model_routing, openai_schema as schema
from uma_serve.gateway.answer import Job, end_error
from uma_serve.gateway.errors import ApiError, bad_request, from_core_error
from uma_serve.gateway.frame_limit import check_frame
from uma_serve.gateway.router import note_session
from uma_serve.gateway.streaming import (
    ClientGone,
    first_event,
    race_disconnect,
    sse_response,
    tagged,
)
from uma_serve.gateway.tool_prompt import grammar_of, grammar_param_of, prefill_of

QOS_HEADER = "x-uma-qos"
# Cap on bytes read (and thrown away) from an oversized body before answering 413, so that a
# client still sending is not cut off mid-write and sees the 413 instead of a reset.
DRAIN_CAP = 64 << 20


class Inflight:
    """A non-blocking gate: requests over the limit are refused, never queued in the gateway."""

    def __init__(self, limit: int, gauge: Any = None) -> None:
        self.limit = limit
        self.current = 0
        self.gauge = gauge

    def enter(self) -> None:
        if self.limit > 0 and self.current >= self.limit:
            raise ApiError(
                429,
                f"{self.current} requests in flight (--max-inflight {self.limit}): retry later",
                type="rate_limit_error",
                code="rate_limit_exceeded",
                headers={"Retry-After": "1"},
            )
        self.current += 1
        if self.gauge is not None:
            self.gauge.inc()

    def leave(self) -> None:
        self.current -= 1
        if self.gauge is not None:
            self.gauge.dec()


def check_json_body(request: Request) -> None:
    """415 unless the body is declared ``application/json`` (parameters such as charset
    allowed). A browser sends text/plain, form and multipart bodies cross-origin without a
    CORS preflight: refusing them keeps any web page from driving a gateway without keys."""
    declared = request.headers.get("content-type")
    media = (declared or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        got = f"got {declared!r}" if declared is not None else "none was given"
        raise ApiError(
            415,
            f"Content-Type must be application/json ({got})",
            param="Content-Type",
            code="unsupported_media_type",
        )


async def read_body(request: Request, limit: int, timeout_s: float = 0) -> bytes:
    """The body, or 413 once it exceeds ``limit`` bytes, or 408 if it has not all arrived
    ``timeout_s`` seconds after the request's head (0: no deadline); 408 and 413 close the
    connection (the rest of the body is not read)."""
    too_big = ApiError(
        413,
        f"request body over the limit of {limit} bytes",
        code="request_too_large",
    )
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > DRAIN_CAP:
        raise too_big
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s if timeout_s > 0 else None):
            async for chunk in request.stream():
                size += len(chunk)
                if size <= limit:
                    chunks.append(chunk)
                elif size > DRAIN_CAP:
                    break
    except TimeoutError:
        raise ApiError(
            408,
            f"request body not received within {timeout_s:g} s (--body-timeout); "
            f"{size} bytes arrived",
            code="request_timeout",
            headers={"Connection": "close"},
        ) from None
    except ClientDisconnect:
        raise ClientGone from None
    if size > limit:
        raise too_big
    return b"".join(chunks)


async def core_info(request: Request) -> p.InfoEvent:
    try:
        return await request.app.state.pool.info()
    except CoreError as exc:
        raise from_core_error(exc) from None


def check_logit_bias(bias: dict[int, float] | None, info: p.InfoEvent) -> None:
    if bias and (top := max(bias)) >= info.n_vocab:
        raise bad_request(
            f"logit_bias token id {top} is not in the vocabulary "
            f"(token ids run from 0 to {info.n_vocab - 1})",
            "logit_bias",
            "invalid_value",
        )


def check_max_tokens(value: int | None, default: int, info: p.InfoEvent, param: str) -> int:
    n = default if value is None else value
    if n <= 0:
        raise bad_request(f"{param} must be at least 1, got {n}", param, "invalid_value")
    if n > info.max_tokens:
        raise bad_request(
            f"{param} is {n}, over this server's limit of {info.max_tokens}", param, "invalid_value"
        )
    return n


def check_prompt_size(nbytes: int, info: p.InfoEvent, param: str) -> None:
    """Refuse here what the core would refuse, before it reaches a shared connection."""
    if nbytes > info.max_prompt_bytes:
        raise ApiError(
            400,
            f"prompt of {nbytes} bytes is over this server's limit of {info.max_prompt_bytes}",
            param=param,
            code="context_length_exceeded",
        )


def qos_of(request: Request, req: schema._Sampling) -> str:
    """A request's label, the first given of: X-UMA-QoS, qos, service_tier ("flex" is
    background), priority (vLLM's: above 0 is background). None: "interactive", whose work
    the core classifies (a long prompt is bulk work, every stream is protected)."""
    header = request.headers.get(QOS_HEADER)
    if header is not None:
        value = header.strip().lower()
        if value not in ("interactive", "background"):
            raise bad_request("X-UMA-QoS must be 'interactive' or 'background'", "X-UMA-QoS")
        return value
    if req.qos is not None:
        return req.qos
    if req.service_tier is not None:
        return "background" if req.service_tier == "flex" else "interactive"
    if req.priority is not None:
        return "background" if req.priority > 0 else "interactive"
    return "interactive"


def sampling(req: schema._Sampling) -> dict[str, Any]:
    """OpenAI sampling fields -> Generate fields. Unset temperature is OpenAI's 1.0; unset
    top_p leaves the core's truncation defaults (top_k 40, top_p 0.95, min_p 0.05, as
    llama.cpp's server applies to OpenAI requests)."""
    out: dict[str, Any] = {
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "presence_penalty": req.presence_penalty or 0.0,
        "frequency_penalty": req.frequency_penalty or 0.0,
        "stop": req.stop,
        "stream": bool(req.stream),
    }
    if req.top_p is not None:
        out["top_p"] = req.top_p
    out.update(lenient.sampling_extras(req))
    if req.seed == -1:  # llama.cpp's and vLLM's "random"
        out["seed"] = secrets.randbits(32)
    elif req.seed is not None:
        out["seed"] = req.seed % (1 << 32)
    if req.ignore_eos:
        out["ignore_eos"] = True
    if req.logit_bias:
        out["logit_bias"] = req.token_bias
    if req.core_logprobs is not None:
        out["logprobs"] = req.core_logprobs
    return out


async def body_and_place(request: Request) -> tuple[bytes, Any, Callable[[], None]]:
    """The body (413, 408; ClientGone), then an in-flight place (429: a slow body holds none)
    and the drain's stop for the request; ``release`` gives both back."""
    state, settings = request.app.state, request.app.state.settings
    body = await read_body(request, settings.max_body_bytes, settings.body_timeout)
    state.drain.refuse_new()  # SIGTERM came while the body arrived
    state.inflight.enter()
    stop = state.drain.add()

    def release() -> None:
        state.drain.discard(stop)
        state.inflight.leave()

    return body, stop, release


async def completions(request: Request) -> Response:
    return await _generate(request, schema.CompletionRequest)


async def chat_completions(request: Request) -> Response:
    return await _generate(request, schema.ChatRequest)


async def _generate(request: Request, kind: type) -> Response:
    state = request.app.state
    settings = state.settings
    state.drain.refuse_new()
    check_json_body(request)
    try:
        body, stop, release = await body_and_place(request)
    except ClientGone:
        return Response(status_code=499)
    handed_off = False
    try:
        req, request.state.ignored_fields = lenient.decode(body, kind, settings.strict_fields)
        note_session(req.user)  # the affinity key with several cores (gateway/router.py)
        qos = qos_of(request, req)
        model, info = await model_routing.resolve(request, req.model)
        check_logit_bias(req.token_bias, info)
        if isinstance(req, schema.CompletionRequest):
            job = _completion_job(request, req, info, model, qos)
        else:
            job = _chat_job(request, req, info, model, qos)
        job.n = req.n or 1
        check_frame(job.generate, job.n, info.max_frame_bytes, job.grammar_param, job.prompt_param)
        if req.stream:
            response = await _start_stream(request, job, release, stop)
            handed_off = True
            return response
        result = await race_disconnect(request, _run_whole(request, job), stop)
        return JSONResponse(result)
    except ClientGone:
        return Response(status_code=499)  # nobody reads it; logged and counted as such
    finally:
        if not handed_off:
            release()


def _completion_job(
    request: Request, req: schema.CompletionRequest, info: p.InfoEvent, model: str, qos: str
) -> Job:
    """A /v1/completions request, checked against the core's info, as a Job."""
    rid = request.state.request_id = f"cmpl-{uuid.uuid4().hex}"
    text = req.prompt_text
    check_prompt_size(len(text.encode()), info, "prompt")
    max_tokens = check_max_tokens(req.max_tokens, 16, info, "max_tokens")
    gen = generate_request(
        id=rid,
        prompt=text,
        max_tokens=max_tokens,
        qos=qos,
        grammar=req.grammar,
        **sampling(req),
    )
    return Job("text", rid, model, gen, req.include_usage, text if req.echo else "")


def _chat_job(
    request: Request, req: schema.ChatRequest, info: p.InfoEvent, model: str, qos: str
) -> Job:
    """A /v1/chat/completions request, checked against the core's info, as a Job."""
    rid = request.state.request_id = f"chatcmpl-{uuid.uuid4().hex}"
    messages = req.core_messages()
    size = sum(len(m["content"].encode()) for m in messages)
    check_prompt_size(size, info, "messages")
    param = req.max_tokens_param
    default = min(request.app.state.settings.default_max_tokens, info.max_tokens)
    max_tokens = check_max_tokens(req.requested_max_tokens, default, info, param)
    prefill = prefill_of(req)  # a forced call's known start: in the prompt, not sampled
    gen = generate_request(
        id=rid,
        messages=[p.Message(**m) for m in messages],
        max_tokens=max_tokens,
        qos=qos,
        grammar=grammar_of(req),
        chat_template_kwargs=req.chat_template_kwargs,
        prefill=prefill or None,
        **sampling(req),
    )
    job = Job("chat", rid, model, gen, req.include_usage, prompt_param="messages")
    job.grammar_param = grammar_param_of(req)
    job.tool_mode, job.tool_prefix = req.tool_mode, prefill
    return job


def generate_request(**fields: Any) -> p.Generate:
    """The core request; what the protocol refuses in a field's text (a NUL byte) is the
    client's 400, naming the field, not a gateway error."""
    try:
        return p.Generate(**fields)
    except ValueError as exc:
        message = str(exc)
        param = message.split("'")[1] if message.count("'") >= 2 else None
        raise ApiError(400, message, param=param, code="invalid_value") from None


async def _run_whole(request: Request, job: Job) -> dict[str, Any]:
    try:
        return await choices.run_whole(request.app.state.pool, job)
    except CoreError as exc:
        raise _core_api_error(exc, job) from None


def _core_api_error(exc: CoreError, job: Job) -> ApiError:
    return from_core_error(exc, job.prompt_param)


async def _start_stream(request: Request, job: Job, on_close: Any, stop: Any = None) -> Response:
    """Wait for the first core event (honest TTFT), then hand the rest to the SSE response."""
    pool = request.app.state.pool
    events = choices.merged(pool, job) if job.n > 1 else tagged(pool.stream(job.generate))
    sent = time.perf_counter()
    asyncio.get_running_loop().call_soon(job.prepare)  # runs once the request is on its way
    try:
        timeout = request.app.state.settings.first_event_timeout
        first = await first_event(request, events, stop, timeout)
    except CoreError as exc:
        await events.aclose()
        raise _core_api_error(exc, job) from None
    except BaseException:
        await events.aclose()
        raise
    ev = first[1]
    if isinstance(ev, p.EosEvent | p.CompletionEvent) and (err := end_error(job, ev)):
        await events.aclose()
        raise err
    arrived, got = getattr(request.state, "uma_arrival", sent), time.perf_counter()

    def observe() -> None:
        gateway_s = (sent - arrived) + (time.perf_counter() - got)
        request.app.state.metrics.added_latency.observe(gateway_s)

    return sse_response(job, first, events, on_close, on_first_sent=observe, stop=stop)
