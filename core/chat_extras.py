"""A generate request's chat extras, checked when it is admitted (core/server.py):
``chat_template_kwargs`` (vLLM's and llama-server's name), more variables for the chat
template such as ``enable_thinking`` (core/chat.py passes them), and ``prefill``, the
answer's given start, which the prompt ends with."""

from __future__ import annotations

from typing import Any

from uma_serve.core import protocol as p


def problem(req: p.Generate) -> str | None:
    """Why the request's extras are refused (``E_PROTO_001``), or None. The kwargs go with
    ``messages`` and cannot replace them; neither holds a NUL (llama.cpp's tokenizer would
    cut the text there, and the template's placeholders for the contents are made of NULs)."""
    kwargs = req.chat_template_kwargs
    if "\x00" in (req.prefill or ""):
        return "'prefill' contains a NUL byte (\\u0000)"
    if kwargs is None:
        return None
    if req.messages is None:
        return "'chat_template_kwargs' needs 'messages'"
    if "messages" in kwargs:
        return "'chat_template_kwargs.messages' cannot replace the messages"
    if has_nul(kwargs):
        return "'chat_template_kwargs' contains a NUL byte (\\u0000)"
    return None


def has_nul(value: Any) -> bool:
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
