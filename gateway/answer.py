"""The contract between a route and the code that runs its request: the route parses the body
into a ``Job`` (the core request and the ``Answer`` that shapes its events), and dispatch runs
it. One Answer class per shape (gateway/openai_answers.py, responses_out.py, anthropic_out.py)
holds everything of its API; the stream pump (gateway/streaming.py) and the whole-body run
(gateway/choices.py) know none of them."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from uma_serve.clients.client import CoreError
from uma_serve.core import protocol as p
from uma_serve.gateway.errors import ApiError, from_core_error

End = p.EosEvent | p.CompletionEvent
# a core request's end: text, finish reason, usage, log-probabilities (None unless asked)
Result = tuple[str, str, p.Usage, list[p.Logprobs] | None]
DONE = b"data: [DONE]\n\n"


class Answer(ABC):
    """One request's answer in its API's shape, built complete by the route.

    Streamed, each call returns the bytes to write: ``open()`` once, then ``token(ev, i)`` for
    each token event of choice ``i`` (the hot path: one call per token), ``end(ev, i)`` once
    per choice (the last one also ends the stream), or ``error(err)`` to end it early. Not
    streamed: ``whole(results)``, the body."""

    n: int = 1  # choices: n > 1 runs one core group (gateway/choices.py)

    def prepare(self) -> None:
        """Work that may be done ahead: run while the core prefills (off the TTFT path)."""
        return None

    def open(self) -> bytes:
        """What the stream starts with, before its first token (nothing, by default)."""
        return b""

    @abstractmethod
    def token(self, ev: p.TokenEvent, i: int) -> bytes: ...

    @abstractmethod
    def end(self, ev: End, i: int) -> bytes: ...

    @abstractmethod
    def error(self, err: ApiError) -> bytes: ...

    @abstractmethod
    def whole(self, results: list[Result]) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Job:
    """A parsed request, ready to run: the core request (``n`` > 1: a group), its answer, and
    the request fields an error names."""

    generate: p.Generate
    answer: Answer
    prompt_param: str = "prompt"  # "messages" for a chat
    grammar_param: str = "grammar"  # the field the core request's grammar was built from


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


def end_error(ev: End, prompt_param: str) -> ApiError | None:
    """An end that is not a normal finish (cancelled by the core, runtime error) as an error."""
    if ev.reason in ("stop", "length"):
        return None
    detail = ev.detail or f"generation ended with reason {ev.reason!r}"
    if ev.reason == "cancelled":
        return from_core_error(CoreError(p.E_SHUTDOWN, detail), prompt_param)
    return ApiError(500, detail, type="server_error", code=p.E_RUNTIME)


def sse(event: str, data: dict[str, Any]) -> bytes:
    """One named SSE event (``event:`` and ``data:`` lines), as Responses and Messages send."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()
