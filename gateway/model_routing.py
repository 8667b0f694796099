"""Cores serving different models behind one gateway: each request goes to a core serving
the model it names.

The cores' models are known from their ``info`` (cached per core, gateway/core_pool.py).
With one model among them nothing changes: any core takes any request, and any name is
accepted unless ``--strict-model-name`` (gateway/model_names.py). With several, a request's
``model`` must be one of a model's names (its internal name, its file's stem, its aliases),
else it is a 404 ``model_not_found`` listing them all; a request naming none goes to the
first core's model. The request's route note (gateway/router.py) then holds the cores serving
that model, and the router ranks, balances and retries among those only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.requests import Request

from uma_serve.clients.client import CoreError
from uma_serve.core import protocol as p
from uma_serve.gateway import model_names
from uma_serve.gateway.errors import E_CONNECT, ApiError, from_core_error
from uma_serve.gateway.router import NOTE, Router


@dataclass
class Served:
    """One model and the cores serving it (in the gateway's order of cores)."""

    names: list[str]  # its id first (gateway/model_names.py)
    info: p.InfoEvent
    cores: list[str] = field(default_factory=list)


def group(infos: list[tuple[str, p.InfoEvent]], served: list[str]) -> list[Served]:
    """The distinct models of (core, info) pairs, in the order their first core comes."""
    models: dict[tuple[str, str], Served] = {}
    for core, info in infos:
        key = model_names.own_names(info)
        if key not in models:
            models[key] = Served(model_names.names(info, served), info)
        models[key].cores.append(core)
    return list(models.values())


def pick(models: list[Served], name: str | None, strict: bool) -> tuple[str, Served]:
    """The name the response carries and the model that answers (module docstring); 404
    for a name no model answers to."""
    if len(models) == 1:
        return model_names.resolve(name, models[0].names, strict), models[0]
    if not name:
        return models[0].names[0], models[0]
    for model in models:
        if name in model.names:
            return name, model
    raise model_names.not_found(name, [n for m in models for n in m.names])


async def core_infos(router: Router) -> tuple[list[tuple[str, p.InfoEvent]], CoreError | None]:
    """Each core's info (cached; asked of a live core that has none yet) and the error of
    one whose model is not known (None if all are); CoreError if no model is known."""
    infos: list[tuple[str, p.InfoEvent]] = []
    missing: CoreError | None = None
    for core in router.cores:
        info = core.pool.cached_info
        if not core.why_hung:  # a core that is down answers at once (connection refused)
            try:
                info = await core.pool.info()
            except CoreError as exc:
                missing = exc
        elif info is None:  # not asked: a request must not wait for a hung core
            missing = CoreError(E_CONNECT, f"{core.label} is unavailable")
        if info is not None:
            infos.append((core.name, info))
    if not infos:
        assert missing is not None
        raise missing
    return infos, missing


async def resolve(request: Request, name: str | None) -> tuple[str, p.InfoEvent]:
    """The response's model name and the info of a core serving it; with several models,
    the request is held to that model's cores. 503 when no core answers, or when the name
    is unknown while a core whose model is not known does not answer (it may serve it)."""
    state = request.app.state
    settings = state.settings
    try:
        infos, missing = await core_infos(state.router)
    except CoreError as exc:
        raise from_core_error(exc) from None
    models = group(infos, settings.served_model_names)
    try:
        model_name, model = pick(models, name, settings.strict_model_name)
    except ApiError:
        if missing is not None:
            raise from_core_error(missing) from None
        raise
    note = NOTE.get()
    if len(models) > 1 and note is not None:
        note.cores = frozenset(model.cores)
    return model_name, model.info
