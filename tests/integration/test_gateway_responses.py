"""POST /v1/responses through the real openai SDK (and the Agents SDK in its default
Responses mode), the real gateway and umad serving the instruct model."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}, "country": {"type": "string",
                                                                           "maxLength": 30}},
    "required": ["city", "country"],
    "additionalProperties": False,
}  # fmt: skip
ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


@pytest.fixture(scope="module")
def client(chat_gateway) -> openai.OpenAI:
    return chat_gateway.client()


def test_text_whole(client, chat_model) -> None:
    r = client.responses.create(
        model=chat_model,
        instructions="You are a helpful assistant.",
        input="What is the capital of France?",
        max_output_tokens=40,
        temperature=0,
    )
    assert r.object == "response" and r.status in ("completed", "incomplete")
    assert r.output_text and r.output[0].type == "message"
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_text_streamed_events_in_the_spec_order(client, chat_model) -> None:
    events = list(
        client.responses.create(
            model=chat_model, input="Name three colors.", max_output_tokens=200, stream=True,
            temperature=0,
        )
    )  # fmt: skip
    kinds = [e.type for e in events]
    squeezed = [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]
    assert squeezed == ORDER, kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and final.output_text == text
    assert final.usage.output_tokens > 0


def test_max_output_tokens_cut_is_incomplete(client, chat_model) -> None:
    r = client.responses.create(model=chat_model, input="Tell me a long story.",
                                max_output_tokens=5)  # fmt: skip
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 5
    events = list(client.responses.create(model=chat_model, input="Tell me a long story.",
                                          max_output_tokens=5, stream=True))  # fmt: skip
    assert events[-1].type == "response.incomplete"


def _call(client, model, stream: bool):
    kw = dict(model=model, input="What is the weather in Paris?", tools=[WEATHER],
              tool_choice="required", max_output_tokens=120, temperature=0)  # fmt: skip
    if not stream:
        return client.responses.create(**kw), None
    events = list(client.responses.create(**kw, stream=True))
    return events[-1].response, events


def test_function_tool_loop(client, chat_model) -> None:
    """The model calls the tool; its output goes back as function_call_output; it answers."""
    r, _ = _call(client, chat_model, stream=False)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    assert "city" in json.loads(calls[0].arguments)
    follow = [
        {"role": "user", "content": "What is the weather in Paris?"},
        *[c.model_dump() for c in calls],
        *[{"type": "function_call_output", "call_id": c.call_id, "output": "22 C and sunny"}
          for c in calls],
    ]  # fmt: skip
    answer = client.responses.create(model=chat_model, input=follow, tools=[WEATHER],
                                     max_output_tokens=60, temperature=0)  # fmt: skip
    assert answer.output_text
    assert all(o.type == "message" for o in answer.output)


def test_function_call_streamed_same_as_whole(client, chat_model) -> None:
    whole, _ = _call(client, chat_model, stream=False)
    streamed, events = _call(client, chat_model, stream=True)
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done and done[0].name == "get_weather"
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"
              and e.item_id == done[0].item_id]  # fmt: skip
    assert done[0].arguments == "".join(pieces)
    as_calls = [[(o.name, o.arguments) for o in r.output if o.type == "function_call"]
                for r in (whole, streamed)]  # fmt: skip
    assert as_calls[0] == as_calls[1]


def test_json_schema_text_format(client, chat_model) -> None:
    r = client.responses.create(
        model=chat_model,
        input="Name a famous city and its country as JSON.",
        text={"format": {"type": "json_schema", "name": "place", "schema": CITY, "strict": True}},
        max_output_tokens=60,
        temperature=0,
    )
    jsonschema.validate(json.loads(r.output_text), CITY)
    assert r.text.format.type == "json_schema"


def test_previous_response_id_is_a_clear_400(client, chat_model) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=chat_model, input="Hi", previous_response_id="resp_1")
    assert err.value.param == "previous_response_id"
    assert "stores no responses" in err.value.message


def test_unsupported_tool_type_names_it(client, chat_model) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=chat_model, input="Hi", tools=[{"type": "web_search"}])
    assert err.value.param == "tools[0].type"


def test_agents_sdk_default_responses_mode_with_a_tool(chat_gateway, chat_model) -> None:
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    seen: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        seen.append(city)
        return f"22 C and sunny in {city}"

    model = agents.OpenAIResponsesModel(
        model=chat_model, openai_client=openai.AsyncOpenAI(base_url=chat_gateway.base_url,
                                                            api_key="none", max_retries=0),
    )  # fmt: skip
    agent = agents.Agent(
        name="weather",
        instructions="Answer weather questions with the get_weather tool.",
        tools=[get_weather],
        model=model,
        model_settings=agents.ModelSettings(
            tool_choice="required", parallel_tool_calls=False, max_tokens=120
        ),
        tool_use_behavior="stop_on_first_tool",
    )
    result = agents.Runner.run_sync(agent, "What is the weather in Paris?")
    assert seen and result.final_output == f"22 C and sunny in {seen[0]}"
