"""The names a served model answers to.

A GGUF's internal name ("Gemma 3 270m") is hard to guess, so a request may also name the
model by its file's stem (``gemma-3-270m-it-Q4_K_M``) or by an alias given with
``--served-model-name`` (repeatable, as vLLM's; the first one is then the model's id). With
one model served, any other name is accepted too (as llama-server does: clients hard-code
names such as ``gpt-4o-mini``) unless ``--strict-model-name``; then it is a 404.
"""

from __future__ import annotations

from pathlib import PurePath

from uma_serve.core import protocol as p
from uma_serve.gateway.errors import ApiError


def names(info: p.InfoEvent, served: list[str]) -> list[str]:
    """Every name of the model, its id first: the aliases, the internal name, the stem."""
    stem = PurePath(info.model_path).stem if info.model_path else ""
    return list(dict.fromkeys(n for n in [*served, info.model, stem] if n))


def resolve(name: str | None, info: p.InfoEvent, served: list[str], strict: bool) -> str:
    """The model name a response carries: the one asked for when the model answers to it,
    the model's id when none (or an empty one) was given, else 404 ``model_not_found``."""
    known = names(info, served)
    if not name:
        return known[0]
    if name in known or not strict:
        return name
    listed = ", ".join(f"'{n}'" for n in known)
    raise ApiError(
        404,
        f"The model '{name}' does not exist; this server serves {listed}",
        param="model",
        code="model_not_found",
    )
