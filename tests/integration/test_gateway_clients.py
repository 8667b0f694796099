"""The clients agents and apps use, unmodified, against the real gateway and daemon:
instructor (tool and JSON-schema modes) and LangChain's ChatOpenAI (with_structured_output by
JSON schema and by function calling, bind_tools whole and streamed).

The embedded model is a small base model: the grammar makes its answers valid, so these check
that each library's request is accepted and its answer parses, not that the answer is right.
"""

from __future__ import annotations

from typing import Annotated, Literal

import instructor
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field, StringConstraints

Word = Annotated[str, StringConstraints(max_length=10)]


class Place(BaseModel):
    name: Word
    kind: Literal["city", "village"]


class Weather(BaseModel):
    """The weather report for one place."""

    place: Place
    unit: Literal["celsius", "fahrenheit"]
    temperature: int
    notes: list[Word] = Field(max_length=2)


ASK = "What is the weather in Paris? Answer as a report."


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA])
def test_instructor_gets_a_valid_model(gateway, model_id, mode) -> None:
    client = instructor.from_openai(gateway.client(), mode=mode)
    report = client.chat.completions.create(
        model=model_id,
        response_model=Weather,
        messages=[{"role": "user", "content": ASK}],
        max_tokens=200,
        max_retries=0,
        temperature=0.5,
    )
    assert isinstance(report, Weather) and isinstance(report.place, Place)


def _chat(gateway, model_id: str, **kw) -> ChatOpenAI:
    return ChatOpenAI(
        model=model_id, base_url=gateway.base_url, api_key="none", max_retries=0, **kw
    )


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(gateway, model_id, method) -> None:
    llm = _chat(gateway, model_id, max_tokens=200, temperature=0.5)
    report = llm.with_structured_output(Weather, method=method).invoke(ASK)
    assert isinstance(report, Weather)


@tool
def get_weather(city: Word, unit: Literal["celsius", "fahrenheit"]) -> str:
    """The current weather in a city."""
    return f"21 degrees {unit} in {city}"


def test_langchain_bind_tools_calls_and_takes_the_result(gateway, model_id) -> None:
    llm = _chat(gateway, model_id, max_tokens=120, temperature=0.5)
    forced = llm.bind_tools([get_weather], tool_choice="get_weather", parallel_tool_calls=False)
    question = HumanMessage("What is the weather in Paris?")
    answer = forced.invoke([question])
    assert isinstance(answer, AIMessage) and len(answer.tool_calls) == 1
    call = answer.tool_calls[0]
    assert call["name"] == "get_weather" and set(call["args"]) == {"city", "unit"}
    result = get_weather.invoke(call)  # a ToolMessage with the call's id
    assert isinstance(result, ToolMessage)
    # the tool's result goes back; with tool_choice auto the model may answer or call again
    again = llm.bind_tools([get_weather]).invoke([question, answer, result])
    assert isinstance(again, AIMessage)


def test_langchain_streamed_tool_call_chunks_assemble(gateway, model_id) -> None:
    llm = _chat(gateway, model_id, max_tokens=120, temperature=0.5)
    forced = llm.bind_tools([get_weather], tool_choice="get_weather", parallel_tool_calls=False)
    chunks = list(forced.stream("What is the weather in Paris?"))
    assert len(chunks) > 2
    whole = chunks[0]
    for c in chunks[1:]:
        whole += c
    assert len(whole.tool_calls) == 1 and whole.tool_calls[0]["name"] == "get_weather"
    assert set(whole.tool_calls[0]["args"]) == {"city", "unit"}
