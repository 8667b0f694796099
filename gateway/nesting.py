"""A bound on how deeply a body's free-form JSON (a tool's ``parameters``, a
``response_format`` schema) may nest, checked before anything walks it recursively.

The typed fields of a body refuse nesting at their first wrong level; only these free-form
values can nest without bound. Nested past ``MAX_SCHEMA_DEPTH`` they are a 400 naming the
field (real schemas nest a few levels; the JSON-schema-to-grammar converter, the tools'
prompt rendering and ``$defs`` hoisting all recurse). Nested past about 1,000 levels,
msgspec itself stops decoding with a RecursionError: ``deep_param`` then finds the field in
the raw body, without recursion, so that this too is a 400 naming it.
"""

from __future__ import annotations

import re
from typing import Any

from uma_serve.gateway.errors import ApiError, bad_request

MAX_SCHEMA_DEPTH = 64  # levels of objects and arrays in one schema (its own object: 1)
# the free-form fields, as paths from the body (None: any list index)
OPEN_FIELDS: tuple[tuple[str | None, ...], ...] = (
    ("tools", None, "function", "parameters"),
    ("response_format", "json_schema", "schema"),
)
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}:,]')


def depth_of(value: Any, limit: int) -> int:
    """How deeply ``value`` nests (a scalar: 0), counting at most to ``limit + 1``."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, dict | list):
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children)
    return deepest


def check_depth(value: Any, param: str) -> None:
    """A 400 naming ``param`` if ``value`` nests deeper than MAX_SCHEMA_DEPTH."""
    if depth_of(value, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        raise too_deep(param)


def too_deep(param: str | None) -> ApiError:
    where = param or "the request body"
    return bad_request(
        f"{where} is nested more than {MAX_SCHEMA_DEPTH} levels deep", param, "invalid_value"
    )


def deep_param(body: bytes, limit: int = 256) -> str | None:
    """The field (a free-form one of OPEN_FIELDS, else the top-level key) holding the first
    place where ``body`` nests deeper than ``limit``; None if nowhere or not an object."""
    path: list[str | int | None] = []
    open_kinds: list[bytes] = []
    expect_key = False
    for match in _TOKEN.finditer(body):
        token = match.group()
        if token in (b"{", b"["):
            if len(open_kinds) >= limit:
                return _param(path)
            open_kinds.append(token)
            path.append(None if token == b"{" else 0)
            expect_key = token == b"{"
        elif token in (b"}", b"]"):
            if not open_kinds:
                return None
            open_kinds.pop()
            path.pop()
            expect_key = False
        elif token == b",":
            if open_kinds and open_kinds[-1] == b"[":
                path[-1] = int(path[-1] or 0) + 1
            expect_key = bool(open_kinds) and open_kinds[-1] == b"{"
        elif token == b":":
            expect_key = False
        elif expect_key and path:
            path[-1] = token[1:-1].decode(errors="replace")
    return None


def _param(path: list[str | int | None]) -> str | None:
    """OpenAI's ``param`` for a path into the body: the free-form field it is in, or its
    top-level field."""
    for field in OPEN_FIELDS:
        got = path[: len(field)]
        if len(got) == len(field) and all(
            (want is None and isinstance(g, int)) or g == want
            for want, g in zip(field, got, strict=True)
        ):
            return "".join(f"[{g}]" if isinstance(g, int) else f".{g}" for g in got).lstrip(".")
    return path[0] if path and isinstance(path[0], str) else None
