"""response_format and tool calls through the real openai SDK, gateway and daemon.

The model is a small base model: these test the machinery (grammar, parsing, streaming
shapes), not the answers' sense.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

KEYS = ["a", "name", "count", "tags", "ok", "kind", "size"]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 10}},
            "required": ["zone"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def leaves() -> st.SearchStrategy[dict]:
    words = st.text("abcdefghij", min_size=1, max_size=6)
    return st.one_of(
        st.just({"type": "integer"}),
        st.just({"type": "boolean"}),
        st.integers(1, 12).map(lambda n: {"type": "string", "maxLength": n}),
        st.lists(words, min_size=1, max_size=4, unique=True).map(lambda e: {"enum": e}),
    )


def objects(values: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    def build(props: dict, data: st.DataObject) -> dict:
        required = data.draw(st.lists(st.sampled_from(sorted(props)), unique=True))
        schema = {"type": "object", "properties": props, "additionalProperties": False}
        return {**schema, "required": required}

    props = st.dictionaries(st.sampled_from(KEYS), values, min_size=1, max_size=3)
    return st.builds(build, props, st.data())


def schemas() -> st.SearchStrategy[dict]:
    arrays = leaves().map(lambda s: {"type": "array", "items": s, "maxItems": 3})
    inner = st.one_of(leaves(), arrays, objects(leaves()))
    return objects(inner)


def _json_schema_answer(sdk, model_id: str, schema: dict, seed: int):
    fmt = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}
    return sdk.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Answer in JSON."}],
        response_format=fmt,
        max_tokens=400,
        temperature=0.7,
        seed=seed,
    )


@settings(max_examples=1, deadline=None, phases=[Phase.generate],
          suppress_health_check=list(HealthCheck))  # fmt: skip
@given(st.lists(schemas(), min_size=20, max_size=20))
def test_json_schema_outputs_validate_for_20_random_schemas(sdk, model_id, batch) -> None:
    with ThreadPoolExecutor(4) as pool:
        futures = [
            pool.submit(_json_schema_answer, sdk, model_id, schema, seed)
            for seed, schema in enumerate(batch)
        ]
        answers = [f.result() for f in futures]
    for schema, r in zip(batch, answers, strict=True):
        choice = r.choices[0]
        assert choice.finish_reason == "stop", (schema, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_json_object_parses_and_a_short_max_tokens_ends_as_length(sdk, model_id) -> None:
    r = sdk.chat.completions.create(
        model=model_id,
        messages=ASK,
        response_format={"type": "json_object"},
        max_tokens=200,
        temperature=0.0,  # greedy: this answer closes its object well within max_tokens
    )
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = sdk.chat.completions.create(  # greedy: a sampled answer may be "{}" and stop in 3
        model=model_id,
        messages=ASK,
        response_format={"type": "json_object"},
        max_tokens=3,
        temperature=0.0,
    )
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.content.startswith("{") and r.usage.completion_tokens == 3


def _check_weather_call(call) -> None:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_forced_tool_call_whole(sdk, model_id, choice) -> None:
    r = sdk.chat.completions.create(
        model=model_id, messages=ASK, tools=[WEATHER, TIME], tool_choice=choice,
        parallel_tool_calls=False, max_tokens=120,
    )  # fmt: skip
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c.message
    assert c.message.content is None and len(c.message.tool_calls) == 1
    if choice == "required":
        assert c.message.tool_calls[0].function.name in ("get_weather", "get_time")
    else:
        _check_weather_call(c.message.tool_calls[0])


def test_forced_tool_call_streamed_assembles_as_the_sdk_does(sdk, model_id) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    kw = dict(model=model_id, messages=ASK, tools=[WEATHER, TIME], tool_choice=named,
              parallel_tool_calls=False, max_tokens=120)  # fmt: skip
    with sdk.chat.completions.stream(**kw) as stream:
        final = stream.get_final_completion()
    c = final.choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.tool_calls and all(
        t.function.name == "get_weather" for t in c.message.tool_calls
    )
    _check_weather_call(c.message.tool_calls[0])
    # by hand: the first delta of a call has id, type and name; the rest only arguments
    chunks = list(sdk.chat.completions.create(**kw, stream=True))
    deltas = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].type == "function" and deltas[0].function.name
    assert len(deltas) > 2 and all(d.id is None for d in deltas[1:] if d.index == 0)
    args = "".join(d.function.arguments or "" for d in deltas if d.index == 0)
    jsonschema.validate(json.loads(args), WEATHER["function"]["parameters"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert all(not (ch.choices[0].delta.content or "") for ch in chunks)


def test_a_tool_result_turn_is_accepted(sdk, model_id) -> None:
    args = json.dumps({"city": "Paris", "unit": "celsius"})
    call = {"id": "call_abc", "type": "function",
            "function": {"name": "get_weather", "arguments": args}}  # fmt: skip
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "21 degrees, sunny"},
    ]
    for choice in ("auto", "none"):
        r = sdk.chat.completions.create(
            model=model_id, messages=messages, tools=[WEATHER], tool_choice=choice, max_tokens=20
        )
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    r = sdk.chat.completions.create(model=model_id, messages=messages, max_tokens=5)
    assert r.choices[0].message.content is not None


def test_auto_parses_a_call_or_answers_text(sdk, model_id) -> None:
    r = sdk.chat.completions.create(
        model=model_id, messages=ASK, tools=[WEATHER], max_tokens=60, temperature=0
    )
    c = r.choices[0]
    if c.finish_reason == "tool_calls":  # a started call is grammar-constrained: valid
        _check_weather_call(c.message.tool_calls[0])
    else:
        assert c.message.tool_calls is None and c.message.content is not None
        assert not c.message.content.startswith("<tool_call>")


def test_a_constrained_request_beside_plain_streams(sdk, model_id) -> None:
    def plain(i: int) -> tuple[str, str]:
        stream = sdk.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": f"Tell story {i}."}],
            max_tokens=40, stream=True, seed=i,
        )  # fmt: skip
        text, reason = "", None
        for ch in stream:
            text += ch.choices[0].delta.content or ""
            reason = ch.choices[0].finish_reason or reason
        return text, reason

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    with ThreadPoolExecutor(4) as pool:
        streams = [pool.submit(plain, i) for i in range(3)]
        constrained = pool.submit(_json_schema_answer, sdk, model_id, schema, 5)
        results = [f.result() for f in streams]
        r = constrained.result()
    assert all(text and reason in ("stop", "length") for text, reason in results)
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "tool_choice"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
         "response_format.json_schema"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ],
)  # fmt: skip
def test_inconsistent_fields_are_400s_naming_them(gateway, body, param) -> None:
    import httpx

    r = httpx.post(f"{gateway.base_url}/chat/completions", json={"messages": ASK, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_chat_without_max_tokens_gets_the_default(gateway, tmp_path) -> None:
    from .gateway_helpers import start_gateway

    core = gateway.proc.args[gateway.proc.args.index("--core-socket") + 1]
    gw = start_gateway(core, "--default-max-tokens", "7", log_dir=tmp_path)
    try:
        sdk = gw.client()
        model = sdk.models.list().data[0].id
        r = sdk.chat.completions.create(model=model, messages=ASK, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "length"
        r = sdk.chat.completions.create(
            model=model, messages=ASK, max_tokens=9, extra_body={"ignore_eos": True}
        )
        assert r.usage.completion_tokens == 9  # a request's own max_tokens wins
    finally:
        gw.stop()


def test_a_completion_takes_a_gbnf_grammar(sdk, model_id, gateway) -> None:
    import httpx

    grammar = 'root ::= "yes" | "no"'
    r = sdk.completions.create(
        model=model_id, prompt="Is water wet?", max_tokens=5, extra_body={"grammar": grammar}
    )
    assert r.choices[0].text in ("yes", "no") and r.choices[0].finish_reason == "stop"
    body = {"prompt": "x", "max_tokens": 2, "grammar": "root ::= nothing"}
    bad = httpx.post(f"{gateway.base_url}/completions", json=body)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "grammar", bad.text
