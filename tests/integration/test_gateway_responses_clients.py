"""/v1/responses from two more clients, as their own documentation uses them, against the real
gateway and umad serving the instruct model: pydantic-ai's OpenAIResponsesModel (an agent run
with a tool) and litellm.responses (streamed and not)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

# litellm fetches its model price list from the network at import unless told to use its own
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402
from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.capabilities import AbstractCapability  # noqa: E402
from pydantic_ai.messages import TextPart, ToolCallPart, ToolReturnPart  # noqa: E402
from pydantic_ai.models.openai import OpenAIResponsesModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402


@dataclass
class CallFirst(AbstractCapability):
    """The first step must call a tool, the next one answers in text: a 135M model does not
    call on its own (pydantic-ai refuses a static ``required``, which would never end)."""

    def get_model_settings(self) -> Any:
        return lambda ctx: {"tool_choice": "required" if ctx.run_step <= 1 else "none"}


def test_pydantic_ai_responses_model_runs_an_agent_with_a_tool(chat_gateway, chat_model) -> None:
    model = OpenAIResponsesModel(
        chat_model, provider=OpenAIProvider(base_url=chat_gateway.base_url, api_key="none")
    )
    agent = Agent(
        model,
        instructions="Answer weather questions with the get_weather tool.",
        model_settings={"temperature": 0, "max_tokens": 120, "parallel_tool_calls": False},
        capabilities=[CallFirst()],
    )
    seen: list[str] = []

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        seen.append(city)
        return f"22 C and sunny in {city}"

    result = agent.run_sync("What is the weather in Paris?")
    parts = [type(p) for m in result.all_messages() for p in m.parts]
    assert parts[1:] == [ToolCallPart, ToolReturnPart, TextPart]  # after the user's prompt
    assert len(seen) == 1 and seen[0]
    assert isinstance(result.output, str) and result.output
    assert result.usage.input_tokens > 0 and result.usage.output_tokens > 0


def _ask(chat_gateway, chat_model, **kw) -> Any:
    return litellm.responses(
        model=f"openai/{chat_model}", api_base=chat_gateway.base_url, api_key="none",
        instructions="You are a helpful assistant.", input="Name three colors.",
        max_output_tokens=40, temperature=0, **kw,
    )  # fmt: skip


def test_litellm_responses_whole_and_streamed(chat_gateway, chat_model) -> None:
    """The same answer both ways (the core is --deterministic), with the spec's events."""
    whole = _ask(chat_gateway, chat_model)
    text = whole.output[0].content[0].text
    assert text and whole.status in ("completed", "incomplete")
    assert whole.usage.input_tokens > 0 and whole.usage.output_tokens > 0
    events = list(_ask(chat_gateway, chat_model, stream=True))
    kinds = [str(getattr(e.type, "value", e.type)) for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    deltas = [e.delta for e in events if str(getattr(e.type, "value", e.type)).endswith(".delta")]
    assert "".join(deltas) == text
    done = events[-1].response
    assert done.status == whole.status
    assert done.usage.output_tokens == whole.usage.output_tokens
