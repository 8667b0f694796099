"""gateway/nesting.py: the depth of free-form JSON, and the field a too-deep body nests in."""

from __future__ import annotations

from uma_serve.gateway.nesting import deep_param, depth_of


def test_depth_counts_objects_and_arrays_and_stops_past_the_limit():
    assert depth_of(1, 5) == 0 and depth_of({}, 5) == 1 and depth_of({"a": [1, {}]}, 5) == 3
    deep: object = 1
    for _ in range(10_000):
        deep = [deep]
    assert depth_of(deep, 5) == 6  # no recursion, no full walk


def test_deep_param_names_the_free_form_field_or_the_top_level_key():
    schema = '{"items": ' * 300 + "{}" + "}" * 300
    tools = (
        '{"tools": [{"function": {"name": "a,\\"b[", "parameters": {}}}, '
        '{"function": {"parameters": SCHEMA}}]}'
    )
    tools = tools.replace("SCHEMA", schema)
    assert deep_param(tools.encode()) == "tools[1].function.parameters"
    fmt = '{"x": "}", "response_format": {"json_schema": {"schema": SCHEMA}}}'.replace(
        "SCHEMA", schema
    )
    assert deep_param(fmt.encode()) == "response_format.json_schema.schema"
    assert deep_param(('{"user": ' + "[" * 300 + "]" * 300 + "}").encode()) == "user"
    assert deep_param(b'{"user": [[1]]}') is None
    assert deep_param(b"[" * 300) is None  # not an object: no field to name
