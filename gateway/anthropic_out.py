"""Anthropic Messages answers (gateway/anthropic_api.py): the whole ``message`` and the
stream's events: ``message_start``, per content block ``content_block_start``,
``content_block_delta`` (``text_delta`` or ``input_json_delta``)..., ``content_block_stop``;
then ``message_delta`` (stop reason, usage) and ``message_stop``. Tool calls are read by the
chat route's parser (gateway/tool_calls.py), so a call is a ``tool_use`` block once complete.
"""

from __future__ import annotations

import json
from typing import Any

from uma_serve.core import protocol as p
from uma_serve.gateway.answer import Answer, End, Result, sse
from uma_serve.gateway.errors import ApiError
from uma_serve.gateway.tool_calls import ToolCallParser, read_calls

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _input(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return {}


def _usage(prompt: int, completion: int, cached: int) -> dict[str, int]:
    return {"input_tokens": prompt, "output_tokens": completion,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}  # fmt: skip


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


class MessagesAnswer(Answer):
    """One request's ``message``: streamed, its events; or whole. ``tool_mode``: calls are
    read from the text."""

    def __init__(self, gen: p.Generate, model: str, tool_mode: str | None) -> None:
        self.id, self.model = "msg_" + gen.id.removeprefix("chatcmpl-"), model
        self.forced, self.prefix = tool_mode == "forced", gen.prefill or ""
        parser = ToolCallParser(forced=self.forced, buf=self.prefix)
        self.parser = parser if tool_mode is not None else None
        self.blocks = _Blocks()

    def whole(self, results: list[Result]) -> dict[str, Any]:
        """The whole ``message``: the answer's text as a text block, then its calls."""
        text, reason, usage, _ = results[0]
        found, calls = read_calls(text, self.forced, self.prefix) if self.parser else (text, [])
        content: list[dict[str, Any]] = [{"type": "text", "text": found}] if found else []
        for c in calls:
            content.append({"type": "tool_use", "id": c.id, "name": c.name,
                            "input": _input(c.arguments)})  # fmt: skip
        if calls and reason == "stop":
            reason = "tool_calls"
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": STOP_REASONS.get(reason, "end_turn"),
            "stop_sequence": None,
            "usage": _usage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens),
        }

    def open(self) -> bytes:
        message = {"id": self.id, "type": "message", "role": "assistant", "content": [],
                   "model": self.model, "stop_reason": None, "stop_sequence": None,
                   "usage": _usage(0, 0, 0)}  # fmt: skip
        return sse("message_start", {"type": "message_start", "message": message})

    def token(self, ev: p.TokenEvent, i: int = 0) -> bytes:
        deltas = self.parser.feed(ev.text) if self.parser else [{"content": ev.text}]
        return b"".join(self.blocks.feed(deltas))

    def end(self, ev: End, i: int = 0) -> bytes:
        tail = self.blocks.feed(self.parser.finish()) if self.parser else []
        return b"".join([*tail, *_end(self.blocks, ev.reason, ev.usage)])

    def error(self, err: ApiError) -> bytes:
        kind = "overloaded_error" if err.status in (429, 503) else "api_error"
        return sse("error", {"type": "error", "error": {"type": kind, "message": err.message}})
