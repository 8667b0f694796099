"""A generate request's ``chat_template_kwargs`` (vLLM's and llama-server's name): more
variables for the chat template, such as ``enable_thinking``, checked as the request is
decoded (core/protocol.py) and passed to the template by core/chat.py."""

from __future__ import annotations

from typing import Any


def check_template_kwargs(kwargs: dict[str, Any] | None, chat: bool) -> None:
    """``chat_template_kwargs`` (if any) go with ``messages``, cannot replace them, and hold
    no NUL (the template's placeholders for the contents are made of NULs: core/chat.py)."""
    if kwargs is None:
        return
    if not chat:
        raise ValueError("'chat_template_kwargs' needs 'messages'")
    if "messages" in kwargs:
        raise ValueError("'chat_template_kwargs.messages' cannot replace the messages")
    if _has_nul(kwargs):
        raise ValueError("'chat_template_kwargs' contains a NUL byte (\\u0000)")


def _has_nul(value: Any) -> bool:
    """Whether a NUL is in any string of a JSON value (object keys too), without recursion:
    a value nested as deep as a frame allows must not overflow the stack."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if "\x00" in v:
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False
