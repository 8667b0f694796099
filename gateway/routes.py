"""OpenAI's generation routes: completions and chat completions. A route parses its body
into a Job (the core request and its Answer, gateway/answer.py) and hands it to dispatch
(gateway/dispatch.py), which runs every generation request the same way.

Parsing: the body validated in one step (400, unknown fields ignored: gateway/lenient.py),
its label (X-UMA-QoS and friends), the model's name (404 for an unknown one), then the core
request, checked against the core's own limits (400 for max_tokens, the prompt's size or a
logit_bias token outside the vocabulary: core/limits.py). The Responses and Messages routes
map their bodies onto the chat request and reuse ``chat_generate``.
"""

from __future__ import annotations

import secrets
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from uma_serve.core import limits, protocol as p
from uma_serve.gateway import dispatch, lenient, model_routing, openai_schema as schema
from uma_serve.gateway.answer import Job
from uma_serve.gateway.errors import ApiError, bad_request, over_limit
from uma_serve.gateway.openai_answers import ChatAnswer, TextAnswer, ToolChatAnswer
from uma_serve.gateway.router import note_session
from uma_serve.gateway.tool_prompt import grammar_of, grammar_param_of, prefill_of

QOS_HEADER = "x-uma-qos"


async def completions(request: Request) -> Response:
    return await dispatch.serve(request, completion_job)


async def chat_completions(request: Request) -> Response:
    return await dispatch.serve(request, chat_job)


async def completion_job(request: Request, body: bytes) -> Job:
    """A /v1/completions body as a Job."""
    req = decode(request, body, schema.CompletionRequest)
    note_session(req.user)  # the affinity key with several cores (gateway/router.py)
    qos = qos_of(request, req)
    model, info = await model_routing.resolve(request, req.model)
    rid = request.state.request_id = f"cmpl-{uuid.uuid4().hex}"
    text = req.prompt_text
    gen = generate_request(
        id=rid,
        prompt=text,
        max_tokens=check_max_tokens(req.max_tokens, 16, "max_tokens"),
        qos=qos,
        grammar=req.grammar,
        n=req.n or 1,
        **sampling(req),
    )
    check_limits(gen, info, "prompt", "max_tokens")
    echo = text if req.echo else ""
    answer = TextAnswer(rid, model, n=gen.n, include_usage=req.include_usage, echo=echo)
    return Job(gen, answer)


async def chat_job(request: Request, body: bytes) -> Job:
    """A /v1/chat/completions body as a Job (with tools: their answer shape)."""
    req = decode(request, body, schema.ChatRequest)
    gen, model = await chat_generate(request, req)
    kw: dict[str, Any] = {"n": gen.n, "include_usage": req.include_usage}
    if req.tool_mode is not None:
        forced, prefix = req.tool_mode == "forced", gen.prefill or ""
        answer: ChatAnswer = ToolChatAnswer(gen.id, model, forced=forced, prefix=prefix, **kw)
    else:
        answer = ChatAnswer(gen.id, model, **kw)
    return Job(gen, answer, "messages", grammar_param_of(req))


async def chat_generate(request: Request, req: schema.ChatRequest) -> tuple[p.Generate, str]:
    """A chat request checked against the info of a core serving its model: the core request
    (a forced tool call's known start as its ``prefill``) and the response's model name."""
    note_session(req.user)
    qos = qos_of(request, req)
    model, info = await model_routing.resolve(request, req.model)
    rid = request.state.request_id = f"chatcmpl-{uuid.uuid4().hex}"
    default = min(request.app.state.settings.default_max_tokens, info.max_tokens)
    param = req.max_tokens_param
    prefill = prefill_of(req)  # a forced call's known start: in the prompt, not sampled
    gen = generate_request(
        id=rid,
        messages=[p.Message(**m) for m in req.core_messages()],
        max_tokens=check_max_tokens(req.requested_max_tokens, default, param),
        qos=qos,
        grammar=grammar_of(req),
        chat_template_kwargs=req.chat_template_kwargs,
        prefill=prefill or None,
        n=req.n or 1,
        **sampling(req),
    )
    check_limits(gen, info, "messages", param)
    return gen, model


def decode(request: Request, body: bytes, kind: type) -> Any:
    """The body as ``kind`` (400s name the field); its unknown fields are ignored and listed
    in the response's X-UMA-Ignored-Fields (with --strict-fields, a 400)."""
    strict = request.app.state.settings.strict_fields
    req, request.state.ignored_fields = lenient.decode(body, kind, strict)
    return req


def check_max_tokens(value: int | None, default: int, param: str) -> int:
    n = default if value is None else value
    if n <= 0:
        raise bad_request(f"{param} must be at least 1, got {n}", param, "invalid_value")
    return n


def check_limits(gen: p.Generate, info: p.InfoEvent, prompt_param: str, tokens_param: str) -> None:
    """What the core would refuse (its limits, read from its info), refused before it is sent,
    naming the request's own fields."""
    over = limits.over_limits(gen, info.max_tokens, info.max_prompt_bytes, info.n_vocab)
    if over is not None:
        raise over_limit(over, {"prompt": prompt_param, "max_tokens": tokens_param})


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


def generate_request(**fields: Any) -> p.Generate:
    """The core request; what the protocol refuses in a field's text (a NUL byte) is the
    client's 400, naming the field, not a gateway error."""
    try:
        return p.Generate(**fields)
    except ValueError as exc:
        message = str(exc)
        param = message.split("'")[1] if message.count("'") >= 2 else None
        raise ApiError(400, message, param=param, code="invalid_value") from None
