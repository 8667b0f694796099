"""The Starlette application: routes, middleware order, per-app state from the lifespan.

Middleware, outermost first: HTTP metrics (counts every answer, 401s and CORS preflights
included), CORS (answers preflights before auth sees them), auth (``/v1/*`` only).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Route

from uma_serve.clients.client import DEFAULT_SOCKET
from uma_serve.gateway import anthropic_api, info_routes, responses_api, routes
from uma_serve.gateway.auth import AuthMiddleware
from uma_serve.gateway.drain import Drain
from uma_serve.gateway.errors import (
    ApiError,
    api_error_handler,
    http_exception_handler,
    unhandled_handler,
)
from uma_serve.gateway.intake import Inflight
from uma_serve.gateway.prom import GatewayMetrics, HttpMetricsMiddleware
from uma_serve.gateway.request_id import ResponseHeaders
from uma_serve.gateway.router import Router, Routing


@dataclass
class Settings:
    core_sockets: list[str] = field(default_factory=lambda: [DEFAULT_SOCKET])
    api_keys: list[str] = field(default_factory=list)
    cors_origins: list[str] = field(default_factory=list)
    max_inflight: int = 64
    max_body_bytes: int = 1 << 20
    body_timeout: float = 30.0
    shutdown_grace: float = 5.0
    pool_size: int = 4
    default_max_tokens: int = 512  # a chat request's max_tokens when it sets none
    routing: Routing = "affinity"
    affinity_chars: int = 512
    balance_slack: int = 4
    health_interval: float = 2.0
    liveness_timeout: float = 5.0  # a core not answering health within this is hung
    first_event_timeout: float = 60.0  # a stream's wait for its first event (0: none)
    vllm_metric_names: bool = False  # /metrics also under vLLM's "vllm:" names
    strict_fields: bool = False  # unknown request fields are 400s (else ignored, listed)
    served_model_names: list[str] = field(default_factory=list)  # aliases, the first the id
    strict_model_name: bool = False  # only the model's names pass (else any, one model)


ROUTES = [
    Route("/v1/completions", routes.completions, methods=["POST"]),
    Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
    Route("/v1/responses", responses_api.create_response, methods=["POST"]),
    Route("/v1/messages", anthropic_api.create_message, methods=["POST"]),
    Route("/v1/models", info_routes.list_models, methods=["GET"]),
    Route("/v1/models/{model:path}", info_routes.get_model, methods=["GET"]),
    Route("/tokenize", info_routes.tokenize, methods=["POST"]),
    Route("/detokenize", info_routes.detokenize, methods=["POST"]),
    Route("/health", info_routes.health, methods=["GET"]),
    Route("/metrics", info_routes.metrics, methods=["GET"]),
]
EXPOSED_HEADERS = ["X-Request-Id", "Retry-After", "X-UMA-Core", "X-UMA-Ignored-Fields"]
KNOWN_PATHS = {r.path for r in ROUTES if "{" not in r.path}


def create_app(settings: Settings) -> Starlette:
    metrics = GatewayMetrics(settings.vllm_metric_names)
    app = Starlette(
        routes=ROUTES,
        middleware=_middleware(settings, metrics),
        lifespan=_lifespan(settings, metrics),
        exception_handlers={
            ApiError: api_error_handler,
            HTTPException: http_exception_handler,
            Exception: unhandled_handler,
        },
    )
    # Starlette's own trailing-slash redirect builds an absolute URL from the Host header;
    # errors.http_exception_handler redirects with a relative one instead
    app.router.redirect_slashes = False
    app.state.known_paths = KNOWN_PATHS
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.inflight = Inflight(settings.max_inflight, metrics.inflight)
    app.state.drain = Drain(settings.shutdown_grace)
    app.state.started = time.time()
    return app


def _lifespan(
    settings: Settings, metrics: GatewayMetrics
) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the cores' Router (``app.state.router``) opens and warms up at
    start-up, and closes at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        router = Router(
            settings.core_sockets,
            pool_size=settings.pool_size,
            routing=settings.routing,
            affinity_chars=settings.affinity_chars,
            balance_slack=settings.balance_slack,
            health_interval=settings.health_interval,
            liveness_timeout=settings.liveness_timeout,
            routed=metrics.routed,
        )
        app.state.router = router  # the routes' view of the cores (gateway/router.py)
        warm = asyncio.ensure_future(router.warm())
        try:
            yield
        finally:
            warm.cancel()
            await router.close()

    return lifespan


def _middleware(settings: Settings, metrics: GatewayMetrics) -> list[Middleware]:
    """The middleware stack, outermost first (the module's docstring says why this order)."""
    middleware = [
        Middleware(HttpMetricsMiddleware, metrics=metrics, routes=KNOWN_PATHS),
        Middleware(ResponseHeaders, routed=len(settings.core_sockets) > 1),
    ]
    if settings.cors_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=settings.cors_origins,
                allow_methods=["GET", "POST", "OPTIONS"],
                # the requested headers are reflected: SDKs send their own (the OpenAI JS
                # SDK's x-stainless-*, Anthropic's anthropic-version); auth still applies
                allow_headers=["*"],
                expose_headers=EXPOSED_HEADERS,
            )
        )
    middleware.append(Middleware(AuthMiddleware, keys=settings.api_keys))
    return middleware
