"""A request too big for the core's frame limit is the client's 400, refused in the gateway.

The core closes a connection whose frame is over its ``--max-frame-bytes``, and the gateway
multiplexes many users' requests on each connection: such a request must never be sent. The
limit is the core's own (its ``info``); the field that made the frame big is named.
"""

from __future__ import annotations

from uma_serve.core import limits, protocol as p
from uma_serve.gateway.errors import ApiError


def too_big(size: int, limit: int, param: str) -> ApiError:
    return ApiError(
        400,
        f"the request is {size} bytes once encoded for the inference core, over its limit of "
        f"{limit} bytes: '{param}' is too large",
        param=param,
        code="request_too_large",
    )


def check_frame(gen: p.Generate, n: int, limit: int, grammar_param: str, text_param: str) -> None:
    """Refuse ``gen`` (sent ``n`` times, with ids a few bytes longer when n > 1) if its frame
    is over ``limit`` (0: the core did not say); the grammar or the text is named, whichever
    is larger."""
    if not limit:
        return
    size = len(p.encode(gen)) - p.HEADER.size + (len(f"-{n - 1}") if n > 1 else 0)
    if size <= limit:
        return
    grammar = len(gen.grammar.encode()) if gen.grammar else 0
    text = limits.prompt_bytes(gen)
    raise too_big(size, limit, grammar_param if grammar >= text else text_param)
