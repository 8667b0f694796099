"""Sampling parameters are defined once, in core/protocol.py's ``Sampling``: the wire's
``Generate`` is that definition, the sampler reads it as it is, and the gateway forwards every
one the OpenAI body sets to the core unchanged. A new parameter is then that field, its step in
core/sampling.py and the OpenAI body's field (gateway/openai_schema.py), with no test to edit:
the values below come from each field's own bounds."""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import inspect as mi

from uma_serve.core import protocol as p
from uma_serve.core.sampling import Sampler
from uma_serve.gateway import openai_schema as schema, routes

FIELDS = mi.type_info(p.Sampling).fields
USER = {"role": "user", "content": "x"}


def a_value(field: mi.Field) -> Any:
    """A valid value of the field that is not its default, as JSON (object keys are strings)."""
    t = field.type
    if isinstance(t, mi.UnionType):
        t = next(x for x in t.types if not isinstance(x, mi.NoneType))
    if isinstance(t, mi.DictType):
        return {"5": 1.5}
    assert isinstance(t, mi.IntType | mi.FloatType), (field.name, t)
    low = t.ge if t.ge is not None else t.gt if t.gt is not None else 0
    high = t.le if t.le is not None else low + 2  # OpenAI's temperature goes to 2
    if isinstance(t, mi.IntType):
        return low + 3 if t.le is None else (low + high) // 4
    return low + (high - low) / 4  # inside the bounds, off today's defaults


def test_generate_is_the_one_definition() -> None:
    defaults = p.Generate(id="a", prompt="x")
    assert issubclass(p.Generate, p.Sampling)
    assert all(getattr(defaults, f.name) == f.default for f in FIELDS)


def test_the_sampler_reads_the_request_itself() -> None:
    req = p.Generate(id="a", prompt="x", top_k=3, logit_bias={5: -1.0})

    class NoDevice:
        params = type("Params", (), {"device_top_k": 0})()

    state = Sampler(NoDevice()).new(0, req, 0)  # type: ignore[arg-type]
    assert state.p is req and list(state.bias_ids) == [5] and list(state.bias) == [-1.0]


def test_every_sampling_field_of_an_openai_body_reaches_the_core_unchanged() -> None:
    """Each of the core's sampling parameters is an OpenAI body field of the same name (the
    gateway's part of a new one), and a value set there is the value the core gets."""
    body = {f.name: a_value(f) for f in FIELDS}
    assert all(body[f.name] != f.default for f in FIELDS)
    for kind in (schema.CompletionRequest, schema.ChatRequest):
        assert {f.name for f in FIELDS} <= set(kind.__struct_fields__), kind
        text = {"prompt": "x"} if kind is schema.CompletionRequest else {"messages": [USER]}
        req = schema.decode(msgspec.json.encode({**body, **text}), kind)
        gen = msgspec.convert({"id": "a", "prompt": "x", **routes.sampling(req)}, p.Generate)
        for f in FIELDS:
            want = body[f.name]
            if isinstance(want, dict):
                want = {int(k): v for k, v in want.items()}
            assert getattr(gen, f.name) == want, f.name
