"""POST /v1/messages (Anthropic's Messages API) over the chat pipeline, as vLLM and
llama-server serve it for Claude-style agents.

The request becomes the chat request it means: ``system`` (a string or text blocks) a system
turn; a message's text blocks its text; an assistant's ``tool_use`` blocks its tool calls
(``input`` as the arguments' JSON); a user's ``tool_result`` blocks tool results (before the
rest of that turn's text); ``tools`` (``input_schema``) function tools; ``tool_choice``
``auto``/``any``/``tool``/``none``; ``stop_sequences`` stops. The answer is built by
gateway/anthropic_out.py.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from uma_serve.gateway import dispatch, openai_schema as schema, routes
from uma_serve.gateway.answer import Job
from uma_serve.gateway.anthropic_out import MessagesAnswer
from uma_serve.gateway.errors import bad_request
from uma_serve.gateway.tool_prompt import grammar_param_of


class MessagesRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The fields this server honours; others are ignored (gateway/lenient.py)."""

    model: str | None = None
    max_tokens: int
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    tools: Annotated[list[dict[str, Any]], msgspec.Meta(max_length=128)] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: schema.Stop | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    top_p: schema.Prob | None = None
    top_k: schema.TopK | None = None
    stream: bool | None = False

    def check(self) -> None:
        if not self.messages:
            raise bad_request("messages must not be empty", "messages")


def _text(blocks: Any, where: str) -> str:
    """Text blocks (or a string) as one text."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise bad_request("content must be a string or a list of blocks", where)
    texts = []
    for j, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else None
            raise bad_request(f"content block type {kind!r} is not supported here",
                              f"{where}[{j}]")  # fmt: skip
        texts.append(str(block.get("text", "")))
    return "\n".join(texts)


def _assistant(content: Any, where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts, calls = [], []
    for j, block in enumerate(content if isinstance(content, list) else []):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_use":
            fn = {"name": block.get("name"), "arguments": json.dumps(block.get("input", {}))}
            calls.append({"id": block.get("id"), "type": "function", "function": fn})
        elif kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind not in ("thinking", "redacted_thinking"):
            raise bad_request(f"content block type {kind!r} is not supported", f"{where}[{j}]")
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _user(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out, texts = [], []
    for j, block in enumerate(content if isinstance(content, list) else []):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result":
            result = block.get("content", "")
            text = _text(result, f"{where}[{j}].content") if result else ""
            out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                        "content": text})  # fmt: skip
        elif kind == "text":
            texts.append(str(block.get("text", "")))
        else:
            raise bad_request(f"content block type {kind!r} is not supported", f"{where}[{j}]")
    if texts:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _messages(req: MessagesRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if req.system:
        out.append({"role": "system", "content": _text(req.system, "system")})
    for i, m in enumerate(req.messages):
        role, where = m.get("role"), f"messages[{i}].content"
        if role == "assistant":
            out.append(_assistant(m.get("content"), where))
        elif role == "user":
            out += _user(m.get("content"), where)
        else:
            raise bad_request(f"role must be user or assistant, not {role!r}",
                              f"messages[{i}].role")  # fmt: skip
    return out


def _tools(req: MessagesRequest, chat: dict[str, Any]) -> None:
    """Tools and tool_choice into ``chat``."""
    if req.tools is not None:
        chat["tools"] = []
        for i, t in enumerate(req.tools):
            if t.get("type") not in (None, "custom"):
                raise bad_request(f"tool type {t.get('type')!r} is not supported",
                                  f"tools[{i}].type")  # fmt: skip
            fn = {"name": t.get("name"), "description": t.get("description"),
                  "parameters": t.get("input_schema")}  # fmt: skip
            chat["tools"].append({"type": "function", "function": fn})
    choice = req.tool_choice
    if choice is None:
        return
    kind = choice.get("type")
    named = {"type": "function", "function": {"name": choice.get("name")}}
    mapped = {"auto": "auto", "any": "required", "none": "none", "tool": named}
    if kind not in mapped:
        raise bad_request(f"tool_choice type {kind!r} is not supported", "tool_choice.type")
    chat["tool_choice"] = mapped[kind]
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def to_chat(req: MessagesRequest) -> schema.ChatRequest:
    """The chat request a Messages request means."""
    same = ("model", "max_tokens", "temperature", "top_p", "top_k", "stream")
    chat: dict[str, Any] = {k: getattr(req, k) for k in same if getattr(req, k) is not None}
    chat["messages"] = _messages(req)
    if req.stop_sequences is not None:
        chat["stop"] = req.stop_sequences
    _tools(req, chat)
    return schema.decode(msgspec.json.encode(chat), schema.ChatRequest)


async def create_message(request: Request) -> Response:
    return await dispatch.serve(request, message_job)


async def message_job(request: Request, body: bytes) -> Job:
    """A /v1/messages body as a Job: the chat request it means, answered as a message."""
    chat = to_chat(routes.decode(request, body, MessagesRequest))
    gen, model = await routes.chat_generate(request, chat)
    return Job(gen, MessagesAnswer(gen, model, chat.tool_mode), "messages", grammar_param_of(chat))
