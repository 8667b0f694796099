"""Unknown request fields: accepted and ignored by default, as vLLM, llama-server and Ollama do.

Clients send fields this server does not define: OpenAI's newer top-level options (``store``,
``metadata``, ``reasoning_effort``...), a message appended as ``message.model_dump()`` (it
carries ``annotations: null``), a content part with ``cache_control``. A body is first decoded
strictly (the fast path); only when msgspec names an unknown field is the body decoded as plain
JSON, every field the request's Structs do not define removed at any depth, and decoded again,
so wrong types and values of known fields are still 400s naming the field. Each ignored field
name is logged once per process and listed in the ``X-UMA-Ignored-Fields`` response header.
``--strict-fields`` keeps the 400 for unknown fields.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import msgspec
from msgspec import inspect as mi

from uma_serve.core import protocol as p
from uma_serve.gateway.errors import ApiError
from uma_serve.gateway.nesting import deep_param, too_deep

log = logging.getLogger("uma.gateway")
UNKNOWN = "unknown field `"  # msgspec's wording for a field no Struct defines
_INDEX = re.compile(r"\[\d+\]")
_logged: set[str] = set()


def decode(body: bytes, kind: type, strict: bool = False) -> tuple[Any, list[str]]:
    """``body`` decoded into ``kind`` and the dotted names of the unknown fields it ignored
    (``messages.annotations``); with ``strict``, an unknown field is the 400 it always was."""
    from uma_serve.gateway.openai_schema import decode as strict_decode, not_json

    try:
        return strict_decode(body, kind), []
    except ApiError as exc:
        if strict or UNKNOWN not in exc.message:
            raise
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:  # msgspec met the unknown field before the break
        raise not_json(exc) from None
    except RecursionError:  # msgspec's, past about 1,000 levels (gateway/nesting.py)
        raise too_deep(deep_param(body)) from None
    ignored: list[str] = []
    strip_unknown(data, mi.type_info(kind), "", ignored)
    names = list(dict.fromkeys(_INDEX.sub("", name) for name in ignored))
    for name in names:
        if name not in _logged:
            _logged.add(name)
            log.warning("ignoring unknown request field %r (--strict-fields refuses it)", name)
    return strict_decode(msgspec.json.encode(data), kind), names


def strip_unknown(data: Any, info: mi.Type, path: str, ignored: list[str]) -> None:
    """Remove from ``data`` (in place) every object key ``info``'s Structs do not define,
    recording its path in ``ignored``. Data of the wrong shape is left as it is: the strict
    decode then names it."""
    if isinstance(info, mi.UnionType):
        for option in info.types:
            if _shape_fits(data, option):
                strip_unknown(data, option, path, ignored)
                return
    elif isinstance(info, mi.StructType) and isinstance(data, dict):
        fields = {f.encode_name: f.type for f in info.fields}
        for key in list(data):
            where = f"{path}.{key}" if path else key
            if key not in fields and key != (info.tag_field or ""):
                del data[key]
                ignored.append(where)
            else:
                strip_unknown(data[key], fields.get(key, mi.AnyType()), where, ignored)
    elif isinstance(info, mi.ListType) and isinstance(data, list):
        for i, item in enumerate(data):
            strip_unknown(item, info.item_type, f"{path}[{i}]", ignored)
    elif isinstance(info, mi.Metadata):
        strip_unknown(data, info.type, path, ignored)


def _shape_fits(data: Any, info: mi.Type) -> bool:
    """Whether ``data`` is an object for a Struct, or an array for a list, of ``info``."""
    if isinstance(info, mi.Metadata):
        return _shape_fits(data, info.type)
    if isinstance(info, mi.StructType):
        return isinstance(data, dict)
    if isinstance(info, mi.ListType):
        return isinstance(data, list)
    return False


# the core's sampling parameters that routes.sampling maps itself (OpenAI's defaults, forms)
_OPENAI_SAMPLING = {"temperature", "top_p", "seed", "presence_penalty", "frequency_penalty",
                    "logit_bias"}  # fmt: skip
_EXTRAS = tuple(n for n in p.Sampling.__struct_fields__ if n not in _OPENAI_SAMPLING)


def sampling_extras(req: Any) -> dict[str, Any]:
    """The core's other sampling parameters (core/protocol.py's ``Sampling``) the body sets
    under their own names, as they are: one added there and to the body's Struct needs nothing
    here. vLLM's spellings: top_k -1 is "off" (the core's 0), ``repetition_penalty`` is
    ``repeat_penalty``."""
    out = {name: v for name in _EXTRAS if (v := getattr(req, name, None)) is not None}
    if "top_k" in out:
        out["top_k"] = max(out["top_k"], 0)
    if "repeat_penalty" not in out and getattr(req, "repetition_penalty", None) is not None:
        out["repeat_penalty"] = req.repetition_penalty
    return out
