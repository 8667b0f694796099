"""Anthropic Messages answers (gateway/anthropic_api.py): the whole ``message`` and the
stream's events: ``message_start``, per content block ``content_block_start``,
``content_block_delta`` (``text_delta`` or ``input_json_delta``)..., ``content_block_stop``;
then ``message_delta`` (stop reason, usage) and ``message_stop``. Tool calls are read by the
chat route's parser (gateway/tool_calls.py), so a call is a ``tool_use`` block once complete.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request

from uma_serve.clients.client import CoreError
from uma_serve.core import protocol as p
from uma_serve.gateway.answer import Job, end_error
from uma_serve.gateway.api_common import sse
from uma_serve.gateway.errors import ApiError, from_core_error
from uma_serve.gateway.streaming import Choice

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _input(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return {}


def _usage(prompt: int, completion: int, cached: int) -> dict[str, int]:
    return {"input_tokens": prompt, "output_tokens": completion,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}  # fmt: skip


def _message_id(job: Job) -> str:
    return "msg_" + job.id.removeprefix("chatcmpl-")


def whole(job: Job, request: Request, result: dict[str, Any]) -> dict[str, Any]:
    """The whole ``message`` from the chat completion of the same request."""
    choice = result["choices"][0]
    message = choice["message"]
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for c in message.get("tool_calls") or []:
        fn = c["function"]
        content.append({"type": "tool_use", "id": c["id"], "name": fn["name"],
                        "input": _input(fn["arguments"])})  # fmt: skip
    u = result["usage"]
    return {
        "id": _message_id(job),
        "type": "message",
        "role": "assistant",
        "model": job.model,
        "content": content,
        "stop_reason": STOP_REASONS.get(choice["finish_reason"], "end_turn"),
        "stop_sequence": None,
        "usage": _usage(
            u["prompt_tokens"], u["completion_tokens"], u["prompt_tokens_details"]["cached_tokens"]
        ),  # fmt: skip
    }


class _Blocks:
    """One stream's content blocks: the open one and the count so far."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "text" or "tool_use"
        self.called = False

    def start(self, block: dict[str, Any]) -> list[bytes]:
        out = self.stop()
        self.index += 1
        self.open = block["type"]
        data = {"type": "content_block_start", "index": self.index, "content_block": block}
        return [*out, sse("content_block_start", data)]

    def stop(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [sse("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def delta(self, delta: dict[str, Any]) -> bytes:
        data = {"type": "content_block_delta", "index": self.index, "delta": delta}
        return sse("content_block_delta", data)

    def feed(self, deltas: list[dict[str, Any]]) -> list[bytes]:
        out: list[bytes] = []
        for d in deltas:
            if text := d.get("content"):
                if self.open != "text":
                    out += self.start({"type": "text", "text": ""})
                out.append(self.delta({"type": "text_delta", "text": text}))
            elif "tool_calls" in d:
                entry = d["tool_calls"][0]
                if "id" in entry:
                    self.called = True
                    out += self.start({"type": "tool_use", "id": entry["id"],
                                       "name": entry["function"]["name"], "input": {}})  # fmt: skip
                if piece := entry["function"].get("arguments"):
                    out.append(self.delta({"type": "input_json_delta", "partial_json": piece}))
        return out


def _start(job: Job) -> bytes:
    message = {"id": _message_id(job), "type": "message", "role": "assistant", "content": [],
               "model": job.model, "stop_reason": None, "stop_sequence": None,
               "usage": _usage(0, 0, 0)}  # fmt: skip
    return sse("message_start", {"type": "message_start", "message": message})


def _end(blocks: _Blocks, reason: str, usage: p.Usage) -> list[bytes]:
    if reason == "stop" and blocks.called:
        reason = "tool_calls"
    delta = {"stop_reason": STOP_REASONS.get(reason, "end_turn"), "stop_sequence": None}
    u = _usage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
    return [
        *blocks.stop(),
        sse("message_delta", {"type": "message_delta", "delta": delta, "usage": u}),
        sse("message_stop", {"type": "message_stop"}),
    ]


def _error(err: ApiError) -> bytes:
    kind = "overloaded_error" if err.status in (429, 503) else "api_error"
    return sse("error", {"type": "error", "error": {"type": kind, "message": err.message}})


async def stream(
    job: Job, request: Request, first: Choice, events: AsyncIterator[Choice]
) -> AsyncIterator[bytes]:
    """The Messages SSE events of one core stream, from its already received first event."""
    yield _start(job)
    blocks = _Blocks()
    parser = job.tool_parser() if job.tool_mode else None
    item: Choice | None = first
    try:
        while item is not None:
            ev = item[1]
            if isinstance(ev, p.TokenEvent):
                deltas = parser.feed(ev.text) if parser else [{"content": ev.text}]
                for chunk in blocks.feed(deltas):
                    yield chunk
            elif isinstance(ev, p.EosEvent | p.CompletionEvent):
                if err := end_error(job, ev):
                    yield _error(err)
                    return
                tail = blocks.feed(parser.finish()) if parser else []
                for chunk in [*tail, *_end(blocks, ev.reason, ev.usage)]:
                    yield chunk
                return
            item = await anext(events, None)
        yield _error(ApiError(500, "the core ended the stream early"))
    except CoreError as exc:
        yield _error(from_core_error(exc, job.prompt_param))
