"""One OpenAI request's answer: its core request(s), its SSE chunks and whole bodies, in the
completions or chat shape, with usage and log-probabilities."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from uma_serve.clients.client import CoreError
from uma_serve.core import protocol as p
from uma_serve.gateway.errors import ApiError, from_core_error
from uma_serve.gateway.logprobs import chat_logprobs, text_logprobs
from uma_serve.gateway.tool_calls import ToolCallParser


@dataclass
class Job:
    """One OpenAI request on its way through the core."""

    kind: Literal["text", "chat"]
    id: str
    model: str
    generate: p.Generate
    include_usage: bool = False
    echo: str = ""
    prompt_param: str = "prompt"
    grammar_param: str = "grammar"  # the field the core request's grammar was built from
    n: int = 1  # choices: n > 1 runs n core requests (gateway/choices.py)
    tool_mode: str | None = None  # "auto" / "forced": tool calls are read from the text
    tool_prefix: str = ""  # the answer's start the prompt ends with (a forced call's head)
    created: int = field(default_factory=lambda: int(time.time()))
    _frames: dict[int, tuple[bytes, bytes]] = field(default_factory=dict, repr=False)
    _offsets: dict[int, int] = field(default_factory=dict, repr=False)  # text_offset per choice
    _roles: dict[int, bytes] = field(default_factory=dict, repr=False)
    _parsers: dict[int, ToolCallParser] = field(default_factory=dict, repr=False)

    @property
    def object(self) -> str:
        return "text_completion" if self.kind == "text" else "chat.completion"

    def chunk(self, choices: list[dict[str, Any]], usage: dict | None = None) -> str:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "text_completion" if self.kind == "text" else "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = usage
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"))

    def _frame(self, index: int) -> tuple[bytes, bytes]:
        """A content chunk's SSE bytes before and after its text, built once per choice."""
        frame = self._frames.get(index)
        if frame is None:
            marker = "\x00"
            whole = self.chunk([self.delta(marker, index=index)])
            head, tail = whole.split(json.dumps(marker), 1)
            frame = self._frames[index] = (b"data: " + head.encode(), tail.encode() + b"\n\n")
        return frame

    def role_event(self, index: int) -> bytes:
        """A chat choice's opening SSE event (the assistant role, no content yet)."""
        if self.kind != "chat":
            return b""
        event = self._roles.get(index)
        if event is None:
            chunk = self.chunk([self.delta("", role=True, index=index)])
            event = self._roles[index] = f"data: {chunk}\n\n".encode()
        return event

    def prepare(self) -> None:
        """Build the per-stream templates ahead of the first token: scheduled to run while the
        core prefills, so none of it is on the TTFT path."""
        for index in range(self.n):
            self._frame(index)
            self.role_event(index)

    def content_event(self, text: str, index: int = 0, lp: p.Logprobs | None = None) -> bytes:
        """One token's whole SSE event: the hot path, so only the text is encoded per token
        (with log-probabilities asked for, the chunk is built whole)."""
        if lp is not None:
            block = self.logprobs_block([lp], index)
            return f"data: {self.chunk([self.delta(text, index=index, lp=block)])}\n\n".encode()
        head, tail = self._frame(index)
        return head + msgspec.json.encode(text) + tail

    def tool_parser(self) -> ToolCallParser:
        """A parser of one choice's calls, which reads the answer's prefilled start first."""
        return ToolCallParser(forced=self.tool_mode == "forced", buf=self.tool_prefix)

    def _parser(self, index: int) -> ToolCallParser:
        parser = self._parsers.get(index)
        if parser is None:
            parser = self._parsers[index] = self.tool_parser()
        return parser

    def _tool_sse(self, index: int, deltas: list[dict[str, Any]]) -> bytes:
        chunks = [
            self.chunk([{"index": index, "delta": d, "logprobs": None, "finish_reason": None}])
            for d in deltas
        ]
        return "".join(f"data: {c}\n\n" for c in chunks).encode()

    def tool_event(self, text: str, index: int) -> bytes:
        """A token's SSE events with tool calls read from the text: content, a call's first
        chunk (id, type, name) or a piece of its arguments; nothing while undecided."""
        return self._tool_sse(index, self._parser(index).feed(text))

    def tool_finish(self, index: int, reason: str) -> tuple[bytes, str]:
        """The events of text held back to the end, and the finish reason: ``tool_calls``
        when the answer made complete calls and stopped by itself."""
        parser = self._parser(index)
        tail = self._tool_sse(index, parser.finish())
        return tail, "tool_calls" if reason == "stop" and parser.complete_calls else reason

    def logprobs_block(self, lps: list[p.Logprobs], index: int = 0) -> dict[str, Any]:
        """OpenAI's ``logprobs`` object for these tokens of choice ``index``."""
        if self.kind == "chat":
            return chat_logprobs(lps)
        block, self._offsets[index] = text_logprobs(lps, self._offsets.get(index, 0))
        return block

    def delta(
        self,
        text: str | None,
        finish: str | None = None,
        role: bool = False,
        index: int = 0,
        lp: dict | None = None,
    ) -> dict:
        if self.kind == "text":
            return {"text": text or "", "index": index, "logprobs": lp, "finish_reason": finish}
        d: dict[str, Any] = {}
        if role:
            d["role"] = "assistant"
        if text is not None:
            d["content"] = text
        return {"index": index, "delta": d, "logprobs": lp, "finish_reason": finish}

    def choice(
        self, index: int, text: str, reason: str, lps: list[p.Logprobs] | None = None
    ) -> dict[str, Any]:
        text = self.echo + text
        block = self.logprobs_block(lps, index) if lps is not None else None
        if self.kind == "text":
            return {"text": text, "index": index, "logprobs": block, "finish_reason": reason}
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if self.tool_mode is not None:
            # as the stream reads it: calls given out once complete, never markup as content
            parser = self.tool_parser()
            deltas = parser.feed(text) + parser.finish()
            content = "".join(d.get("content", "") for d in deltas)
            called = parser.calls or self.tool_mode == "forced"
            message["content"] = (content or None) if called else content
            if calls := parser.complete_calls:
                message["tool_calls"] = [c.message_dict() for c in calls]
                reason = "tool_calls" if reason == "stop" else reason
        return {
            "index": index,
            "message": message,
            "logprobs": block,
            "finish_reason": reason,
        }

    def whole(self, results: list[Result]) -> dict[str, Any]:
        """The whole answer from each choice's (text, finish reason, usage, logprobs)."""
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [self.choice(i, r[0], r[1], r[3]) for i, r in enumerate(results)],
            "usage": usage_dict(total_usage([r[2] for r in results])),
        }

    def group(self) -> p.Generate:
        """The core request for n > 1: one frame, n sequences (ids ``<id>-<i>``, seeds
        ``seed + i``, so the choices differ yet stay reproducible), admitted all or none."""
        return msgspec.structs.replace(self.generate, n=self.n)


# a core request's end: text, finish reason, usage, log-probabilities (None unless asked)
Result = tuple[str, str, p.Usage, list[p.Logprobs] | None]


def total_usage(usages: list[p.Usage]) -> p.Usage:
    """n choices share one prompt (counted once, as OpenAI does); their completions add up."""
    completion = sum(u.completion_tokens for u in usages)
    return p.Usage(usages[0].prompt_tokens, completion, usages[0].cached_tokens)


def usage_dict(u: p.Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


def end_error(job: Job, ev: p.EosEvent | p.CompletionEvent) -> ApiError | None:
    """An end that is not a normal finish (cancelled by the core, runtime error) as an error."""
    if ev.reason in ("stop", "length"):
        return None
    detail = ev.detail or f"generation ended with reason {ev.reason!r}"
    if ev.reason == "cancelled":
        return from_core_error(CoreError(p.E_SHUTDOWN, detail), job.prompt_param)
    return ApiError(500, detail, type="server_error", code=p.E_RUNTIME)
