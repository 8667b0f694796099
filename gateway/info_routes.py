"""The routes that generate nothing: models, /tokenize and /detokenize, /health, /metrics."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from uma_serve.clients.client import CoreError
from uma_serve.core import limits, protocol as p
from uma_serve.gateway import model_names, model_routing, openai_schema as schema
from uma_serve.gateway.errors import bad_request, from_core_error, over_limit
from uma_serve.gateway.intake import check_json_body, core_info, read_body
from uma_serve.gateway.streaming import ClientGone


async def fresh_core_infos(request: Request) -> list[p.InfoEvent]:
    """The cores' info asked now, not the cache: the model list answers 503 while no core
    is up instead of naming a model nobody serves."""
    try:
        return await request.app.state.router.fresh_infos()
    except CoreError as exc:
        raise from_core_error(exc) from None


def _distinct_models(infos: list[p.InfoEvent]) -> list[p.InfoEvent]:
    return list({model_names.own_names(info): info for info in infos}.values())


def _named(infos: list[p.InfoEvent], request: Request) -> list[tuple[str, p.InfoEvent]]:
    """Each model under each of its names (gateway/model_names.py), its id first."""
    served = request.app.state.settings.served_model_names
    return [(n, i) for i in infos for n in model_names.names(i, served)]


async def list_models(request: Request) -> Response:
    named = _named(_distinct_models(await fresh_core_infos(request)), request)
    data = [_model_card(i, request, n) for n, i in named]
    return JSONResponse({"object": "list", "data": data})


async def get_model(request: Request) -> Response:
    infos = _distinct_models(await fresh_core_infos(request))
    settings = request.app.state.settings
    pairs = [(str(i), info) for i, info in enumerate(infos)]
    models = model_routing.group(pairs, settings.served_model_names)
    name, model = model_routing.pick(
        models, request.path_params["model"], settings.strict_model_name
    )
    return JSONResponse(_model_card(model.info, request, name))


def _model_card(info: p.InfoEvent, request: Request, name: str) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": int(request.app.state.started),
        "owned_by": "uma-serve",
        "max_model_len": info.n_ctx_per_seq,
    }


@contextlib.contextmanager
def counted(request: Request) -> Iterator[None]:
    """Hold one of ``--max-inflight``'s places (429 when none is free) while the core works:
    a flood of large /tokenize calls must not slow every stream down unbounded."""
    inflight = request.app.state.inflight
    inflight.enter()
    try:
        yield
    finally:
        inflight.leave()


async def _small_body(request: Request, kind: type) -> Any:
    settings = request.app.state.settings
    check_json_body(request)
    try:
        body = await read_body(request, settings.max_body_bytes, settings.body_timeout)
    except ClientGone:
        return None
    req = schema.decode(body, kind)
    await model_routing.resolve(request, req.model)  # with several models: that one's cores
    return req


async def tokenize(request: Request) -> Response:
    """llama-server's /tokenize: ``{"tokens": [ids]}``, or with ``with_pieces``
    ``{"tokens": [{"id", "piece"}]}`` (a piece that is not valid UTF-8 alone: its bytes)."""
    req = await _small_body(request, schema.TokenizeRequest)
    if req is None:
        return Response(status_code=499)
    limit = (await core_info(request)).max_prompt_bytes
    if over := limits.over_prompt_bytes(len(req.content.encode()), limit):
        raise over_limit(over, {"prompt": "content"})
    flags = {"add_special": req.add_special, "parse_special": req.parse_special}
    ask = p.TokenizeRequest(content=req.content, with_pieces=req.with_pieces, **flags)
    try:
        with counted(request):
            ev = await request.app.state.router.ask(ask, p.TokensEvent)
    except CoreError as exc:
        raise from_core_error(exc, "content") from None
    if ev.pieces is None:
        return JSONResponse({"tokens": ev.tokens})
    tokens = [{"id": t, "piece": s} for t, s in zip(ev.tokens, ev.pieces, strict=True)]
    return JSONResponse({"tokens": tokens})


async def detokenize(request: Request) -> Response:
    """llama-server's /detokenize: ``{"content": text}``."""
    req = await _small_body(request, schema.DetokenizeRequest)
    if req is None:
        return Response(status_code=499)
    limit = (await core_info(request)).max_prompt_bytes  # tokenize's bound, in tokens
    if len(req.tokens) > limit:
        message = f"{len(req.tokens)} tokens, over this server's limit of {limit}"
        raise bad_request(message, "tokens", "invalid_value")
    try:
        with counted(request):
            ask = p.DetokenizeRequest(tokens=req.tokens)
            content = (await request.app.state.router.ask(ask, p.TextEvent)).content
    except CoreError as exc:
        err = from_core_error(exc, "tokens")
        if exc.code == p.E_PROTO:
            err.param, err.code = "tokens", "invalid_value"
        raise err from None
    return JSONResponse({"content": content})


def _not_ok_reason(status: str) -> str:
    if status == "draining":
        return "the core is draining (shutting down)"
    return "the core's engine has stopped: restart umad"


async def health(request: Request) -> Response:
    """200 when a core answers ``health`` with ok; 503 with the reason otherwise. With
    several cores, ``core`` sums their queues and ``cores`` gives each one's state."""
    results = await request.app.state.router.healths()
    ok = [h for _, h in results if isinstance(h, p.HealthEvent) and h.status == "ok"]
    answered = [h for _, h in results if isinstance(h, p.HealthEvent)]
    body: dict[str, Any] = {
        "status": "ok" if ok else "unavailable",
        "core": {
            "active_sessions": sum(h.active_sessions for h in answered),
            "waiting_sessions": sum(h.waiting_sessions for h in answered),
        },
    }
    if len(results) == 1:
        h = results[0][1]
        if isinstance(h, CoreError):
            return JSONResponse({"status": "unavailable", "reason": h.message}, status_code=503)
        if h.status != "ok":
            body["status"], body["reason"] = h.status, _not_ok_reason(h.status)
        return JSONResponse(body, status_code=200 if ok else 503)
    cores = []
    for core, h in results:
        if isinstance(h, CoreError):
            cores.append({"core": core.label, "status": "unavailable", "reason": h.message})
            continue
        one = {
            "core": core.label,  # "core i": /health needs no key, so no socket path
            "status": h.status,
            "active_sessions": h.active_sessions,
            "waiting_sessions": h.waiting_sessions,
        }
        if h.status != "ok":
            one["reason"] = _not_ok_reason(h.status)
        cores.append(one)
    body["cores"] = cores
    if not ok:
        body["reason"] = "no core is available"
    return JSONResponse(body, status_code=200 if ok else 503)


async def metrics(request: Request) -> Response:
    """Prometheus text; the cores' part comes from one snapshot of each taken now."""
    state = request.app.state
    snapshots = await state.router.snapshots(5.0)
    # No await between setting the snapshots and rendering: concurrent scrapes cannot mix.
    state.metrics.core.set_snapshots(snapshots)
    data = generate_latest(state.metrics.registry)
    return Response(data, media_type=CONTENT_TYPE_LATEST)
