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

import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request

from uma_serve.clients.client import CoreError
from uma_serve.core import protocol as p
from uma_serve.gateway.answer import Job, end_error, usage_dict
from uma_serve.gateway.api_common import sse
from uma_serve.gateway.errors import ApiError, from_core_error
from uma_serve.gateway.streaming import Choice


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


def response_object(
    job: Job, request: Request, status: str, output: list[dict], usage: dict | None
) -> dict[str, Any]:
    req = request.state.responses_request
    text = req.text if req.text and "format" in req.text else {"format": {"type": "text"}}
    return {
        "id": "resp_" + job.id.removeprefix("chatcmpl-"),
        "object": "response",
        "created_at": job.created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": job.model,
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        "temperature": job.generate.temperature,
        "text": text,
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": req.tools or [],
        "top_p": job.generate.top_p,
        "truncation": "disabled",
        "usage": usage,
        "user": req.user,
        "metadata": {},
    }


def _message(text: str, status: str = "completed", item_id: str | None = None) -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id or _id("msg"), "type": "message", "status": status,
            "role": "assistant", "content": [part] if status == "completed" else []}  # fmt: skip


def _call(call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {"id": _id("fc"), "type": "function_call", "status": status, "call_id": call_id,
            "name": name, "arguments": arguments}  # fmt: skip


def whole(job: Job, request: Request, result: dict[str, Any]) -> dict[str, Any]:
    """The whole ``response`` from the chat completion of the same request."""
    choice = result["choices"][0]
    message = choice["message"]
    output = [_message(message["content"])] if message.get("content") else []
    for c in message.get("tool_calls") or []:
        output.append(_call(c["id"], c["function"]["name"], c["function"]["arguments"]))
    status = "incomplete" if choice["finish_reason"] == "length" else "completed"
    return response_object(job, request, status, output, usage_of(result["usage"]))


class _Writer:
    """One stream's events: the numbering, the open item, the output so far."""

    def __init__(self, job: Job, request: Request) -> None:
        self.job, self.request = job, request
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item being written
        self.text = ""

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse(kind, data)

    def response(self, status: str, usage: dict | None = None) -> dict[str, Any]:
        return response_object(self.job, self.request, status, self.output, usage)

    def _where(self) -> dict[str, Any]:
        assert self.open is not None
        return {"item_id": self.open["id"], "output_index": len(self.output)}

    def text_delta(self, text: str) -> list[bytes]:
        out = []
        if self.open is None or self.open["type"] != "message":
            out += self.close()
            self.open, self.text = _message("", "in_progress"), ""
            out.append(self.event("response.output_item.added", output_index=len(self.output),
                                  item=self.open))  # fmt: skip
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
            self.open = _call(entry["id"], fn["name"], "", "in_progress")
            out.append(self.event("response.output_item.added", output_index=len(self.output),
                                  item=dict(self.open)))  # fmt: skip
        if piece := fn.get("arguments"):
            assert self.open is not None
            self.open["arguments"] += piece
            out.append(self.event("response.function_call_arguments.delta", **self._where(),
                                  delta=piece))  # fmt: skip
        return out

    def close(self) -> list[bytes]:
        """The events that end the open item, if any."""
        item, out = self.open, []
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
        self.open = None
        return out

    def deltas(self, deltas: list[dict[str, Any]]) -> list[bytes]:
        out: list[bytes] = []
        for d in deltas:
            if d.get("content"):
                out += self.text_delta(d["content"])
            elif "tool_calls" in d:
                out += self.call_delta(d["tool_calls"][0])
        return out

    def end(self, reason: str, usage: p.Usage) -> list[bytes]:
        out = self.close()
        status = "incomplete" if reason == "length" else "completed"
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        resp = self.response(status, usage_of(usage_dict(usage)))
        return [*out, self.event(kind, response=resp)]

    def failed(self, err: ApiError) -> bytes:
        resp = {**self.response("failed"), "error": {"code": err.code or "server_error",
                                                      "message": err.message}}  # fmt: skip
        return self.event("response.failed", response=resp)


async def stream(
    job: Job, request: Request, first: Choice, events: AsyncIterator[Choice]
) -> AsyncIterator[bytes]:
    """The Responses SSE events of one core stream, from its already received first event."""
    w = _Writer(job, request)
    yield w.event("response.created", response=w.response("in_progress"))
    yield w.event("response.in_progress", response=w.response("in_progress"))
    parser = job.tool_parser() if job.tool_mode else None
    item: Choice | None = first
    try:
        while item is not None:
            ev = item[1]
            if isinstance(ev, p.TokenEvent):
                deltas = parser.feed(ev.text) if parser else [{"content": ev.text}]
                for chunk in w.deltas(deltas):
                    yield chunk
            elif isinstance(ev, p.EosEvent | p.CompletionEvent):
                if err := end_error(job, ev):
                    yield w.failed(err)
                    return
                tail = w.deltas(parser.finish()) if parser else []
                for chunk in [*tail, *w.end(ev.reason, ev.usage)]:
                    yield chunk
                return
            item = await anext(events, None)
        yield w.failed(ApiError(500, "the core ended the stream early", code="server_error"))
    except CoreError as exc:
        yield w.failed(from_core_error(exc, job.prompt_param))
