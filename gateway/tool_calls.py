"""Tool calls in the model's output: the documented block format, parsed as text arrives.

A call is ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (docs/GATEWAY.md
"Tool calls"); calls are grammar-constrained to it (with ``auto``, an answer that starts one), and
parsed as it arrives. One incremental parser serves both the stream (OpenAI's ``delta.tool_calls``:
the id, type and name first, then the arguments in pieces, as the SDK assembles them) and
the whole answer (the same parser fed everything at once), so both carry the same calls.

A call is given out only once its arguments are complete: a call cut by ``max_tokens`` is
dropped (the complete ones before it stay calls, in both modes), and a call identical to an
earlier one of the same answer (same name and arguments: a small model repeats itself until
the limit) is dropped too. The call markup never becomes content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from uma_serve.gateway.gbnf import TOOL_CLOSE, TOOL_OPEN

_NAME = r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"'
_HEAD = re.compile(
    r"\s*" + re.escape(TOOL_OPEN) + r"\s*\{\s*" + _NAME + r'\s*,\s*"arguments"\s*:\s*'
)
_TAIL = re.compile(r"\s*\}\s*" + re.escape(TOOL_CLOSE))


@dataclass
class Call:
    id: str
    name: str
    arguments: str = ""
    pieces: list[str] = field(default_factory=list)  # the arguments as they arrived

    @property
    def key(self) -> str:
        """What makes two calls the same: the name and the arguments' JSON value."""
        try:
            args = json.dumps(json.loads(self.arguments), sort_keys=True)
        except ValueError:
            args = self.arguments
        return f"{self.name}\x00{args}"

    def message_dict(self) -> dict[str, Any]:
        fn = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": fn}


@dataclass
class ToolCallParser:
    """Splits a choice's text into content and tool calls. Modes: ``text`` (plain content,
    no call parsed), ``wait`` (not yet known whether a call starts), ``head`` (a call's
    header being read), ``args`` (its arguments, streamed), ``tail`` (after them)."""

    forced: bool = False  # the grammar guarantees calls: nothing is content
    calls: list[Call] = field(default_factory=list)  # every call started
    given: list[Call] = field(default_factory=list)  # the complete, distinct ones given out
    mode: str = "wait"
    buf: str = ""
    _depth: int = 0
    _in_str: bool = False
    _esc: bool = False
    _started: bool = False

    def feed(self, text: str) -> list[dict[str, Any]]:
        """The deltas this text makes: ``{"content": s}`` or a ``tool_calls`` entry."""
        out: list[dict[str, Any]] = []
        self.buf += text
        while self.buf:
            before = (self.mode, len(self.buf))
            self._step(out)
            if (self.mode, len(self.buf)) == before:
                break  # needs more text
        return out

    def _step(self, out: list[dict[str, Any]]) -> None:
        if self.mode == "text":
            out.append({"content": self.buf})
            self.buf = ""
        elif self.mode in ("wait", "tail"):
            stripped = self.buf.lstrip()
            if stripped.startswith(TOOL_OPEN):
                self.mode = "head"
            elif not TOOL_OPEN.startswith(stripped) and self.mode == "wait" and not self.forced:
                self.mode = "text"
            elif self.mode == "tail" and not TOOL_OPEN.startswith(stripped):
                self.buf = ""  # stray text after the calls: not content of a call answer
        elif self.mode == "head":
            m = _HEAD.match(self.buf)
            if m:
                name = json.loads(f'"{m.group(1)}"')
                self.calls.append(Call(f"call_{uuid.uuid4().hex[:24]}", name))
                self.buf = self.buf[m.end() :]
                self.mode, self._depth, self._started = "args", 0, False
        elif self.mode == "args":
            if not self._started:  # the value's leading space is no part of it
                self.buf = self.buf.lstrip()
            n = self._value_end(self.buf)
            piece, rest = (self.buf, "") if n is None else (self.buf[:n], self.buf[n:])
            if piece:
                self.calls[-1].arguments += piece
                self.calls[-1].pieces.append(piece)
            self.buf = rest
            if n is not None:
                self.mode = "close"
                self._give(self.calls[-1], out)
        if self.mode == "close":
            m = _TAIL.match(self.buf)
            if m:
                self.buf, self.mode = self.buf[m.end() :], "tail"

    def _value_end(self, text: str) -> int | None:
        """Where the arguments' JSON value ends in ``text`` (None: not yet), tracking nesting
        and strings across calls."""
        for i, ch in enumerate(text):
            if self._in_str:
                if self._esc:
                    self._esc = False
                elif ch == "\\":
                    self._esc = True
                elif ch == '"':
                    self._in_str = False
                    if self._depth == 0:
                        return i + 1
            elif ch == '"':
                self._in_str, self._started = True, True
            elif ch in "{[":
                self._depth, self._started = self._depth + 1, True
            elif ch in "}]":
                self._depth -= 1
                if self._depth <= 0:
                    return i + 1
            elif ch.isspace() and not self._started:
                continue
        return None

    def _give(self, call: Call, out: list[dict[str, Any]]) -> None:
        """A complete call's deltas (its head, then its arguments' pieces), unless it repeats
        an earlier call."""
        if any(c.key == call.key for c in self.given):
            return
        self.given.append(call)
        index = len(self.given) - 1
        head = {"index": index, "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": ""}}  # fmt: skip
        out.append({"tool_calls": [head]})
        for piece in call.pieces:
            out.append({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})

    def finish(self) -> list[dict[str, Any]]:
        """At the end: text held back while a call might have started becomes content
        (``auto``: it was no call after all; a call's cut head is markup, never content)."""
        if self.mode == "wait" and self.buf and not self.calls and not self.forced:
            text, self.buf = self.buf, ""
            return [{"content": text}]
        return []

    @property
    def complete_calls(self) -> list[Call]:
        """The calls given out: complete (one cut short by max_tokens is not) and distinct."""
        return self.given if self.mode != "text" else []


def read_calls(text: str, forced: bool, prefix: str = "") -> tuple[str | None, list[Call]]:
    """A whole answer read as its stream would be, after ``prefix`` (its prefilled start):
    the content (None once a call was made or had to be: never markup as content) and the
    complete calls given out."""
    parser = ToolCallParser(forced=forced, buf=prefix)
    deltas = parser.feed(text) + parser.finish()
    content = "".join(d.get("content", "") for d in deltas)
    called = bool(parser.calls) or forced
    return (content or None) if called else content, parser.complete_calls
