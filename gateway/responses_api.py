"""POST /v1/responses (OpenAI's Responses API), stateless, over the chat pipeline.

The request is translated into the chat request it means: ``instructions`` a system turn,
``input`` text a user turn or its items turns (messages; ``function_call`` items an
assistant's tool calls, ``function_call_output`` items tool results), function ``tools``,
``tool_choice``, ``text.format`` as ``response_format`` and ``max_output_tokens`` as
``max_completion_tokens``; the answer is built by gateway/responses_out.py. Nothing is
stored: ``previous_response_id`` and item references are 400s (send the whole input).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from uma_serve.gateway import dispatch, openai_schema as schema, routes
from uma_serve.gateway.answer import Job
from uma_serve.gateway.errors import bad_request
from uma_serve.gateway.responses_out import ResponsesAnswer
from uma_serve.gateway.tool_prompt import grammar_param_of

TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


class ResponsesRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The fields this server honours; others are ignored (gateway/lenient.py)."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: Annotated[list[dict[str, Any]], msgspec.Meta(max_length=128)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = None
    temperature: schema.Temperature | None = None
    top_p: schema.Prob | None = None
    seed: int | None = None
    stream: bool | None = False
    previous_response_id: str | None = None
    user: str | None = None
    service_tier: schema.ServiceTier | None = None
    top_k: schema.TopK | None = None
    min_p: schema.Prob | None = None
    repeat_penalty: schema.RepeatPenalty | None = None
    repetition_penalty: schema.RepeatPenalty | None = None

    def check(self) -> None:
        if self.previous_response_id:
            raise bad_request(
                "previous_response_id is not supported: this server stores no responses; "
                "send the whole conversation in input",
                "previous_response_id",
                "unsupported_value",
            )


def _text_of(content: Any, where: str) -> str:
    """A message item's content as text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request("content must be a string or a list of parts", where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        text = part.get("text", part.get("refusal")) if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(text, str):
            raise bad_request(f"content part type {kind!r} is not supported (text only)",
                              f"{where}[{j}]")  # fmt: skip
        texts.append(text)
    return "\n".join(texts)


def _item_message(item: dict[str, Any], where: str, out: list[dict[str, Any]]) -> None:
    """One input item appended to ``out`` as chat messages."""
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        out.append({"role": role, "content": _text_of(item.get("content"), f"{where}.content")})
    elif kind == "function_call":
        fn = {"name": item.get("name"), "arguments": item.get("arguments", "")}
        call = {"id": item.get("call_id"), "type": "function", "function": fn}
        last = out[-1] if out else None
        if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
            last["tool_calls"].append(call)
        else:
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else _text_of(output, f"{where}.output")
        out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
    elif kind != "reasoning":  # a reasoning item carries nothing this model reads
        raise bad_request(f"input item type {kind!r} is not supported", f"{where}.type")


def _messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        out.append({"role": "user", "content": req.input})
        return out
    for i, item in enumerate(req.input):
        _item_message(item, f"input[{i}]", out)
    return out


def _tools(req: ResponsesRequest) -> list[dict[str, Any]] | None:
    if req.tools is None:
        return None
    tools = []
    for i, tool in enumerate(req.tools):
        if tool.get("type") != "function":
            raise bad_request(f"tool type {tool.get('type')!r} is not supported (function only)",
                              f"tools[{i}].type")  # fmt: skip
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        tools.append({"type": "function", "function": fn})
    return tools


def _tool_choice(choice: str | dict[str, Any] | None) -> Any:
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise bad_request("tool_choice: only auto, none, required or a function",
                              "tool_choice")  # fmt: skip
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return fmt
    spec = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
    return {"type": "json_schema", "json_schema": {"name": "response", **spec}}


_SAME = (
    "model", "temperature", "top_p", "seed", "stream", "user", "service_tier",
    "parallel_tool_calls", "top_k", "min_p", "repeat_penalty", "repetition_penalty",
)  # fmt: skip


def to_chat(req: ResponsesRequest) -> schema.ChatRequest:
    """The chat request a Responses request means."""
    chat: dict[str, Any] = {k: getattr(req, k) for k in _SAME if getattr(req, k) is not None}
    chat["messages"] = _messages(req)
    if (tools := _tools(req)) is not None:
        chat["tools"] = tools
    if req.tool_choice is not None:
        chat["tool_choice"] = _tool_choice(req.tool_choice)
    if (fmt := _response_format(req.text)) is not None:
        chat["response_format"] = fmt
    if req.max_output_tokens is not None:
        chat["max_completion_tokens"] = req.max_output_tokens
    return schema.decode(msgspec.json.encode(chat), schema.ChatRequest)


async def create_response(request: Request) -> Response:
    return await dispatch.serve(request, response_job)


async def response_job(request: Request, body: bytes) -> Job:
    """A /v1/responses body as a Job: the chat request it means, answered as a response."""
    req = routes.decode(request, body, ResponsesRequest)
    chat = to_chat(req)
    gen, model = await routes.chat_generate(request, chat)
    answer = ResponsesAnswer(req, gen, model, chat.tool_mode)
    return Job(gen, answer, "messages", grammar_param_of(chat))
