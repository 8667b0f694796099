"""The Responses API's answers (gateway/responses_api.py): the whole ``response`` object, and
the stream's events in the spec's order:

``response.created``, ``response.in_progress``; per output item ``response.output_item.added``,
for a message ``response.content_part.added``, ``response.output_text.delta``...,
``response.output_text.done``, ``response.content_part.done``, for a function call
``response.function_call_arguments.delta``..., ``response.function_call_arguments.done``; then
``response.output_item.done``; last ``response.completed`` (``response.incomplete`` when
``max_output_tokens`` cut the answer) with usage. Tool calls are read by the chat route's
parser (gateway/tool_calls.py), so both routes see the same calls.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from uma_serve.core import protocol as p
from uma_serve.gateway.answer import Answer, End, Result, sse, usage_dict
from uma_serve.gateway.errors import ApiError
from uma_serve.gateway.tool_calls import ToolCallParser, read_calls

if TYPE_CHECKING:
    from uma_serve.gateway.responses_api import ResponsesRequest


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage_of(u: dict[str, Any]) -> dict[str, Any]:
    """Chat usage in the Responses shape."""
    return {
        "input_tokens": u["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": u["prompt_tokens_details"]["cached_tokens"]},
        "output_tokens": u["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u["total_tokens"],
    }


def _message(text: str, status: str = "completed", item_id: str | None = None) -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id or _id("msg"), "type": "message", "status": status,
            "role": "assistant", "content": [part] if status == "completed" else []}  # fmt: skip


def _call(call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {"id": _id("fc"), "type": "function_call", "status": status, "call_id": call_id,
            "name": name, "arguments": arguments}  # fmt: skip


class ResponsesAnswer(Answer):
    """One request's ``response``: streamed, its events (the numbering, the item being
    written, the output so far); or whole. ``tool_mode``: calls are read from the text."""

    def __init__(
        self, req: ResponsesRequest, gen: p.Generate, model: str, tool_mode: str | None
    ) -> None:
        self.req, self.model = req, model
        self.id = "resp_" + gen.id.removeprefix("chatcmpl-")
        self.created = int(time.time())
        self.temperature, self.top_p = gen.temperature, gen.top_p
        self.forced, self.prefix = tool_mode == "forced", gen.prefill or ""
        parser = ToolCallParser(forced=self.forced, buf=self.prefix)
        self.parser = parser if tool_mode is not None else None
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.item: dict[str, Any] | None = None  # the item being written
        self.text = ""

    def response(self, status: str, usage: dict | None = None) -> dict[str, Any]:
        """The ``response`` object as it stands."""
        req = self.req
        text = req.text if req.text and "format" in req.text else {"format": {"type": "text"}}
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "model": self.model,
            "output": self.output,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": self.temperature,
            "text": text,
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "tools": req.tools or [],
            "top_p": self.top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": req.user,
            "metadata": {},
        }

    def whole(self, results: list[Result]) -> dict[str, Any]:
        """The whole ``response``: the answer's text as a message, then its calls."""
        text, reason, usage, _ = results[0]
        content, calls = read_calls(text, self.forced, self.prefix) if self.parser else (text, [])
        output = [_message(content)] if content else []
        output += [_call(c.id, c.name, c.arguments) for c in calls]
        self.output = output
        status = "incomplete" if reason == "length" else "completed"
        return self.response(status, usage_of(usage_dict(usage)))

    # --- the stream ------------------------------------------------------------------------

    def open(self) -> bytes:
        created = self.event("response.created", response=self.response("in_progress"))
        return created + self.event("response.in_progress", response=self.response("in_progress"))

    def token(self, ev: p.TokenEvent, i: int = 0) -> bytes:
        deltas = self.parser.feed(ev.text) if self.parser else [{"content": ev.text}]
        return b"".join(self.deltas(deltas))

    def end(self, ev: End, i: int = 0) -> bytes:
        tail = self.deltas(self.parser.finish()) if self.parser else []
        out = self.close()
        status = "incomplete" if ev.reason == "length" else "completed"
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        resp = self.response(status, usage_of(usage_dict(ev.usage)))
        return b"".join([*tail, *out, self.event(kind, response=resp)])

    def error(self, err: ApiError) -> bytes:
        error = {"code": err.code or "server_error", "message": err.message}
        return self.event("response.failed", response={**self.response("failed"), "error": error})

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse(kind, data)

    def _where(self) -> dict[str, Any]:
        assert self.item is not None
        return {"item_id": self.item["id"], "output_index": len(self.output)}

    def text_delta(self, text: str) -> list[bytes]:
        out = []
        if self.item is None or self.item["type"] != "message":
            out += self.close()
            self.item, self.text = _message("", "in_progress"), ""
            out.append(self.event("response.output_item.added", output_index=len(self.output),
                                  item=self.item))  # fmt: skip
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(self.event("response.content_part.added", **self._where(),
                                  content_index=0, part=part))  # fmt: skip
        self.text += text
        out.append(self.event("response.output_text.delta", **self._where(), content_index=0,
                              delta=text, logprobs=[]))  # fmt: skip
        return out

    def call_delta(self, entry: dict[str, Any]) -> list[bytes]:
        out = []
        fn = entry["function"]
        if "id" in entry:
            out += self.close()
            self.item = _call(entry["id"], fn["name"], "", "in_progress")
            out.append(self.event("response.output_item.added", output_index=len(self.output),
                                  item=dict(self.item)))  # fmt: skip
        if piece := fn.get("arguments"):
            assert self.item is not None
            self.item["arguments"] += piece
            out.append(self.event("response.function_call_arguments.delta", **self._where(),
                                  delta=piece))  # fmt: skip
        return out

    def close(self) -> list[bytes]:
        """The events that end the open item, if any."""
        item, out = self.item, []
        if item is None:
            return out
        if item["type"] == "message":
            part = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}
            out.append(self.event("response.output_text.done", **self._where(), content_index=0,
                                  text=self.text, logprobs=[]))  # fmt: skip
            out.append(self.event("response.content_part.done", **self._where(),
                                  content_index=0, part=part))  # fmt: skip
            item = _message(self.text, item_id=item["id"])
        else:
            out.append(self.event("response.function_call_arguments.done", **self._where(),
                                  name=item["name"], arguments=item["arguments"]))  # fmt: skip
            item = {**item, "status": "completed"}
        out.append(self.event("response.output_item.done", output_index=len(self.output),
                              item=item))  # fmt: skip
        self.output.append(item)
        self.item = None
        return out

    def deltas(self, deltas: list[dict[str, Any]]) -> list[bytes]:
        out: list[bytes] = []
        for d in deltas:
            if d.get("content"):
                out += self.text_delta(d["content"])
            elif "tool_calls" in d:
                out += self.call_delta(d["tool_calls"][0])
        return out
