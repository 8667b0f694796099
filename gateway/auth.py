"""Bearer-key auth for ``/v1/*``: pure ASGI, constant-time comparison, ``/health`` stays open.

Every configured key is compared (``hmac.compare_digest``) without stopping at the first
match, so the answer time does not tell which key, or how much of one, was right.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from uma_serve.gateway.errors import ApiError

PROTECTED_PREFIX = "/v1/"
PROTECTED_PATHS = ("/tokenize", "/detokenize")  # llama-server's routes, at the root


def key_matches(presented: str, keys: list[bytes]) -> bool:
    given = presented.encode("utf-8", "surrogateescape")
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(given, key)
    return ok


def bearer_of(header: bytes | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.decode("latin-1").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


class AuthMiddleware:
    def __init__(self, app: ASGIApp, keys: list[str]) -> None:
        self.app = app
        self.keys = [k.encode("utf-8") for k in keys if k]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        protected = path.startswith(PROTECTED_PREFIX) or path in PROTECTED_PATHS
        if not self.keys or scope["type"] != "http" or not protected:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        token = bearer_of(headers.get(b"authorization"))
        if token is None and (api_key := headers.get(b"x-api-key")):  # Anthropic's SDK
            token = api_key.decode("latin-1").strip() or None
        if token is None:
            err = ApiError(
                401,
                "missing API key: send 'Authorization: Bearer YOUR_KEY'",
                code="invalid_api_key",
            )
        elif not key_matches(token, self.keys):
            err = ApiError(401, "incorrect API key provided", code="invalid_api_key")
        else:
            await self.app(scope, receive, send)
            return
        err.headers["WWW-Authenticate"] = "Bearer"
        await err.response()(scope, receive, send)
