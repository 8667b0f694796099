"""The names a served model answers to.

A GGUF's internal name ("Gemma 3 270m") is hard to guess, so a request may also name the
model by its file's stem (``gemma-3-270m-it-Q4_K_M``) or by an alias given with
``--served-model-name`` (repeatable, as vLLM's; the first one is then the model's id). With
several models behind one gateway, ``--served-model-name ALIAS=MODEL`` gives an alias to the
model one of whose own names is MODEL only. With one model served, any other name is
accepted too (as llama-server does: clients hard-code names such as ``gpt-4o-mini``) unless
``--strict-model-name``; then it is a 404.
"""

from __future__ import annotations

from pathlib import PurePath

from uma_serve.core import protocol as p
from uma_serve.gateway.errors import ApiError


def own_names(info: p.InfoEvent) -> tuple[str, str]:
    """What tells models apart: the GGUF's internal name and its file's stem."""
    return info.model, PurePath(info.model_path).stem if info.model_path else ""


def names(info: p.InfoEvent, served: list[str]) -> list[str]:
    """Every name of the model, its id first: the aliases, the internal name, the stem."""
    own = own_names(info)
    aliases = []
    for entry in served:
        alias, _, model = entry.partition("=")
        if not model or model in own:
            aliases.append(alias)
    return list(dict.fromkeys(n for n in [*aliases, *own] if n))


def resolve(name: str | None, known: list[str], strict: bool) -> str:
    """The model name a response carries: the one asked for when the model answers to it
    (one of ``known``, its id first), the id when none (or an empty one) was given, else
    404 ``model_not_found``."""
    if not name:
        return known[0]
    if name in known or not strict:
        return name
    raise not_found(name, known)


def not_found(name: str, known: list[str]) -> ApiError:
    listed = ", ".join(f"'{n}'" for n in known)
    return ApiError(
        404,
        f"The model '{name}' does not exist; this server serves {listed}",
        param="model",
        code="model_not_found",
    )
