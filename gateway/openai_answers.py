"""OpenAI's answers: a text completion, a chat completion, a chat completion with tools.

Streamed, every chunk is a ``data: {...}`` event. A token's chunk differs from the choice's
others only in its text, so it is a template built once per choice with the token's
JSON-encoded text between its two halves. A chat choice opens with the assistant role; a
choice's finish reason rides on its last chunk; once every choice ended, the usage chunk
(``include_usage``) and ``[DONE]`` follow.
"""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec

from uma_serve.core import protocol as p
from uma_serve.gateway.answer import DONE, Answer, End, Result, total_usage, usage_dict
from uma_serve.gateway.errors import ApiError
from uma_serve.gateway.logprobs import chat_logprobs, text_logprobs
from uma_serve.gateway.tool_calls import ToolCallParser, read_calls

MARKER = "\x00"  # the text's place in a template: JSON-encoded as "\u0000", never in a text


def _json(body: Any) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


class _Chunks(Answer):
    """What the three shapes share: the chunk envelope, the per-choice templates, the ends."""

    object = ""  # the whole body's
    chunk_object = ""

    def __init__(self, id: str, model: str, *, n: int = 1, include_usage: bool = False) -> None:
        self.id, self.model, self.n, self.include_usage = id, model, n, include_usage
        self.created = int(time.time())
        self._fresh = set(range(n))  # the choices that sent nothing yet
        self._usages: list[p.Usage] = []
        self._frames: list[tuple[bytes, bytes]] = []  # per choice, built by prepare()

    # --- per shape -------------------------------------------------------------------------

    def delta(self, text: str | None, i: int, finish: str | None = None, lp: Any = None) -> dict:
        """One choice's entry of a chunk."""
        raise NotImplementedError

    def choice(
        self, i: int, text: str, reason: str, usage: p.Usage, lps: list[p.Logprobs] | None
    ) -> dict[str, Any]:
        """One choice of the whole body."""
        raise NotImplementedError

    def logprobs_block(self, lps: list[p.Logprobs], i: int) -> dict[str, Any]:
        raise NotImplementedError

    def _opening(self, i: int) -> bytes:
        """What goes before choice ``i``'s first chunk."""
        return b""

    def _first_text(self, text: str) -> str:
        """Choice's first text (with the prompt in front, for ``echo``)."""
        return text

    def _closing(self, ev: End, i: int, first: bool) -> bytes:
        """The chunk that ends choice ``i`` (``first``: it sent nothing before)."""
        return self.chunk([self.delta(None, i, finish=ev.reason)])

    # --- the stream ------------------------------------------------------------------------

    def chunk(self, choices: list[dict[str, Any]], usage: dict | None = None) -> bytes:
        body: dict[str, Any] = {
            "id": self.id,
            "object": self.chunk_object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = usage
        return b"data: " + _json(body) + b"\n\n"

    def prepare(self) -> None:
        """Build the per-choice templates. Dispatch schedules this to run while the core
        prefills, so that none of it is on the TTFT path; a choice's first token or its end
        (never the hot path) builds them if they are not yet there."""
        if not self._frames:
            self._frames = [self._template(i) for i in range(self.n)]

    def _template(self, i: int) -> tuple[bytes, bytes]:
        """Choice ``i``'s token chunk: its bytes before and after the text."""
        head, tail = self.chunk([self.delta(MARKER, i)]).split(json.dumps(MARKER).encode(), 1)
        return head, tail

    def token(self, ev: p.TokenEvent, i: int = 0) -> bytes:
        """The hot path: only the text is encoded (a choice's first token, or one with
        log-probabilities, takes ``_token_chunk``)."""
        if ev.logprobs is None and i not in self._fresh:
            head, tail = self._frames[i]
            return head + msgspec.json.encode(ev.text) + tail
        return self._token_chunk(ev, i)

    def _token_chunk(self, ev: p.TokenEvent, i: int) -> bytes:
        self.prepare()
        first = i in self._fresh
        self._fresh.discard(i)
        text = self._first_text(ev.text) if first else ev.text
        if ev.logprobs is None:
            head, tail = self._frames[i]
            body = head + msgspec.json.encode(text) + tail
        else:
            body = self.chunk([self.delta(text, i, lp=self.logprobs_block([ev.logprobs], i))])
        return self._opening(i) + body if first else body

    def end(self, ev: End, i: int = 0) -> bytes:
        self.prepare()
        first = i in self._fresh
        self._fresh.discard(i)
        out = (self._opening(i) if first else b"") + self._closing(ev, i, first)
        self._usages.append(ev.usage)
        if len(self._usages) < self.n:
            return out
        if self.include_usage:
            out += self.chunk([], usage_dict(total_usage(self._usages)))
        return out + DONE

    def error(self, err: ApiError) -> bytes:
        return b"data: " + json.dumps(err.body()).encode() + b"\n\n" + DONE

    # --- not streamed ----------------------------------------------------------------------

    def whole(self, results: list[Result]) -> dict[str, Any]:
        """The whole answer from each choice's (text, finish reason, usage, logprobs)."""
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [self.choice(i, *r) for i, r in enumerate(results)],
            "usage": usage_dict(total_usage([r[2] for r in results])),
        }


class TextAnswer(_Chunks):
    """/v1/completions; ``echo``: the prompt, in front of each choice's text."""

    object = chunk_object = "text_completion"

    def __init__(self, id: str, model: str, *, echo: str = "", **kw: Any) -> None:
        self.echo = echo
        self._offsets: dict[int, int] = {}  # text_offset per choice
        super().__init__(id, model, **kw)

    def delta(self, text: str | None, i: int, finish: str | None = None, lp: Any = None) -> dict:
        return {"text": text or "", "index": i, "logprobs": lp, "finish_reason": finish}

    def _first_text(self, text: str) -> str:
        return self.echo + text

    def _closing(self, ev: End, i: int, first: bool) -> bytes:
        return self.chunk([self.delta(self.echo if first else None, i, finish=ev.reason)])

    def logprobs_block(self, lps: list[p.Logprobs], i: int) -> dict[str, Any]:
        block, self._offsets[i] = text_logprobs(lps, self._offsets.get(i, 0))
        return block

    def choice(
        self, i: int, text: str, reason: str, usage: p.Usage, lps: list[p.Logprobs] | None
    ) -> dict[str, Any]:
        block = self.logprobs_block(lps, i) if lps is not None else None
        return {"text": self.echo + text, "index": i, "logprobs": block, "finish_reason": reason}


class ChatAnswer(_Chunks):
    """/v1/chat/completions; each streamed choice opens with the assistant's role."""

    object, chunk_object = "chat.completion", "chat.completion.chunk"

    def __init__(self, id: str, model: str, **kw: Any) -> None:
        super().__init__(id, model, **kw)
        self._roles: list[bytes] = []  # per choice, built by prepare()

    def prepare(self) -> None:
        super().prepare()
        if not self._roles:
            role = {"role": "assistant", "content": ""}
            self._roles = [
                self.chunk([{"index": i, "delta": role, "logprobs": None, "finish_reason": None}])
                for i in range(self.n)
            ]

    def delta(self, text: str | None, i: int, finish: str | None = None, lp: Any = None) -> dict:
        d = {} if text is None else {"content": text}
        return {"index": i, "delta": d, "logprobs": lp, "finish_reason": finish}

    def _opening(self, i: int) -> bytes:
        return self._roles[i]

    def logprobs_block(self, lps: list[p.Logprobs], i: int) -> dict[str, Any]:
        return chat_logprobs(lps)

    def choice(
        self, i: int, text: str, reason: str, usage: p.Usage, lps: list[p.Logprobs] | None
    ) -> dict[str, Any]:
        message = {"role": "assistant", "content": text, "refusal": None}
        block = self.logprobs_block(lps, i) if lps is not None else None
        return {"index": i, "message": message, "logprobs": block, "finish_reason": reason}


class ToolChatAnswer(ChatAnswer):
    """A chat completion whose tool calls are read from the text (gateway/tool_calls.py):
    streamed, a token gives content, a call's first chunk (id, type, name), a piece of its
    arguments, or nothing while undecided; ``forced``: the grammar makes every answer calls.
    ``prefix``: the answer's start the prompt ends with (a forced call's head: the core's
    prefill), read before the text. Log-probabilities are not streamed in this mode."""

    def __init__(self, id: str, model: str, *, forced: bool, prefix: str = "", **kw: Any) -> None:
        super().__init__(id, model, **kw)
        self.forced, self.prefix = forced, prefix
        self._parsers = [ToolCallParser(forced=forced, buf=prefix) for _ in range(self.n)]

    def _deltas(self, i: int, deltas: list[dict[str, Any]]) -> bytes:
        return b"".join(
            self.chunk([{"index": i, "delta": d, "logprobs": None, "finish_reason": None}])
            for d in deltas
        )

    def token(self, ev: p.TokenEvent, i: int = 0) -> bytes:
        head = b""
        if i in self._fresh:
            self.prepare()
            self._fresh.discard(i)
            head = self._roles[i]
        return head + self._deltas(i, self._parsers[i].feed(ev.text))

    def _closing(self, ev: End, i: int, first: bool) -> bytes:
        """Text held back while a call might have started, then the finish reason:
        ``tool_calls`` when the answer made complete calls and stopped by itself."""
        parser = self._parsers[i]
        held = self._deltas(i, parser.finish())
        reason = "tool_calls" if ev.reason == "stop" and parser.complete_calls else ev.reason
        return held + self.chunk([self.delta(None, i, finish=reason)])

    def choice(
        self, i: int, text: str, reason: str, usage: p.Usage, lps: list[p.Logprobs] | None
    ) -> dict[str, Any]:
        content, calls = read_calls(text, self.forced, self.prefix)  # as the stream reads it
        if calls and reason == "stop":
            reason = "tool_calls"
        out = super().choice(i, text, reason, usage, lps)
        out["message"]["content"] = content
        if calls:
            out["message"]["tool_calls"] = [c.message_dict() for c in calls]
        return out
