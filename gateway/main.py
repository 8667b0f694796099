"""uma-gateway: the OpenAI-compatible HTTP front of a running umad, under uvicorn."""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
from dataclasses import asdict, fields
from typing import Any

import uvicorn

from uma_serve.clients.client import DEFAULT_SOCKET
from uma_serve.gateway.app import Settings, create_app
from uma_serve.gateway.drain import STOP_MARGIN_S, GatewayServer
from uma_serve.gateway.early_close import close_unread_body
from uma_serve.gateway.http_limits import limited_protocol
from uma_serve.gateway.logs import log_config
from uma_serve.gateway.tcp_cork import cork_response_head


def env_list(name: str) -> list[str]:
    """A comma-separated environment variable as a list (empty entries dropped)."""
    return [v.strip() for v in os.environ.get(name, "").split(",") if v.strip()]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="uma-gateway", description="OpenAI-compatible HTTP gateway for the UMA Serve core."
    )
    _add_core_arguments(ap)
    _add_liveness_arguments(ap)
    _add_http_arguments(ap)
    _add_limit_arguments(ap)
    _add_behaviour_arguments(ap)
    _add_logging_arguments(ap)
    ap.set_defaults(**settings_defaults())
    return ap


def settings_defaults() -> dict[str, Any]:
    """The defaults of the flags that set Settings are its own (one place); with no
    --core-socket or --api-key, the environment decides (settings_from)."""
    return {**asdict(Settings()), "core_sockets": None, "api_keys": None}


def _add_core_arguments(ap: argparse.ArgumentParser) -> None:
    """The cores behind the gateway and how requests are routed among them."""
    ap.add_argument(
        "--core-socket",
        dest="core_sockets",
        action="append",
        help="a core's Unix socket; repeat it to put several cores (one umad each) behind "
        "this gateway (env UMA_SOCKET, comma-separated; default umad's: "
        "$XDG_RUNTIME_DIR/uma/uma.sock, else /run/uma/uma.sock for root)",
    )
    ap.add_argument(
        "--routing",
        choices=["affinity", "round-robin"],
        help="with several cores: affinity (a session's or a prompt's start keeps its core, "
        "so the prefix cache hits) or round-robin",
    )
    ap.add_argument(
        "--affinity-chars",
        type=int,
        help="with several cores and no session key (X-Session-Id header or OpenAI 'user'): "
        "the leading characters of a prompt, or of each chat message up to the first user "
        "message, that pick the core",
    )
    ap.add_argument(
        "--balance-slack",
        type=int,
        help="with several cores: the preferred core is passed over for the least-loaded one "
        "when it holds more than this many requests in flight beyond it",
    )


def _add_liveness_arguments(ap: argparse.ArgumentParser) -> None:
    """How the gateway tells a core that is down or hung."""
    ap.add_argument(
        "--health-interval",
        type=float,
        help="seconds between health checks of each core (with several cores, a core that "
        "fails leaves the rotation at once, and returns at the first check it passes)",
    )
    ap.add_argument(
        "--liveness-timeout",
        type=float,
        help="seconds a core has to answer a health check; a core that does not is taken as "
        "hung: its connections are closed and requests get 503 at once until it answers",
    )
    ap.add_argument(
        "--first-event-timeout",
        type=float,
        help="seconds a streamed request waits for the core's first event (its first token, "
        "queueing included); later: 503 core_timeout (0: no limit)",
    )


def _add_http_arguments(ap: argparse.ArgumentParser) -> None:
    """Where the gateway listens and who may call it."""
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on")
    ap.add_argument("--port", type=int, default=8000, help="TCP port to listen on")
    ap.add_argument(
        "--api-key",
        dest="api_keys",
        action="append",
        help="accepted bearer key for /v1/* (repeatable; env UMA_API_KEY, comma-separated)",
    )
    ap.add_argument(
        "--cors-origin",
        dest="cors_origins",
        action="append",
        help="origin allowed by CORS (repeatable; none by default; '*' for any)",
    )


def _add_limit_arguments(ap: argparse.ArgumentParser) -> None:
    """HTTP limits: in-flight requests, body and head sizes, their deadlines."""
    ap.add_argument(
        "--max-inflight",
        type=int,
        help="generation requests held at once; more get 429 + Retry-After (0: no limit)",
    )
    ap.add_argument("--max-body-bytes", type=int, help="largest request body (413 beyond)")
    ap.add_argument(
        "--body-timeout",
        type=float,
        help="seconds a request body may take to arrive after its headers; later: 408 and the "
        "connection closes (0: no limit)",
    )
    ap.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds a request's headers may take to arrive; later: 408 and the connection "
        "closes (0: no limit)",
    )
    ap.add_argument(
        "--max-header-bytes",
        type=int,
        default=65536,
        help="largest request head (request line and headers); larger: 431 (0: no limit)",
    )
    ap.add_argument(
        "--keep-alive-timeout",
        type=int,
        default=5,
        help="seconds an idle keep-alive connection stays open",
    )


def _add_behaviour_arguments(ap: argparse.ArgumentParser) -> None:
    """Shutdown, request defaults, /metrics names and the core connection pool."""
    ap.add_argument(
        "--shutdown-grace",
        type=float,
        help="on SIGTERM, seconds running requests may finish; then a stream ends with an "
        "error chunk and [DONE], a request still waiting gets 503 shutting_down",
    )
    ap.add_argument(
        "--default-max-tokens",
        type=int,
        help="a chat request's max_tokens when it sets none (capped at the core's --max-tokens)",
    )
    ap.add_argument(
        "--vllm-metric-names",
        action="store_true",
        help="/metrics also exports the families vLLM has under vLLM's own 'vllm:' names, for "
        "dashboards made for vLLM (off by default: promtool's lint flags the colon)",
    )
    ap.add_argument("--pool-size", type=int, help="connections to the core")
    ap.add_argument(
        "--served-model-name",
        dest="served_model_names",
        action="append",
        help="a name the model answers to (repeatable; the first is its id in /v1/models); "
        "the GGUF's internal name and its file's stem are accepted too; ALIAS=MODEL: a name "
        "of the model whose internal name or file stem is MODEL only (cores serving "
        "different models)",
    )
    ap.add_argument(
        "--strict-model-name",
        action="store_true",
        help="a request naming a model that is not one of its names gets 404 (by default, "
        "with one model served, any name is accepted; with several, never)",
    )
    ap.add_argument(
        "--strict-fields",
        action="store_true",
        help="refuse request fields this server does not define with a 400 (by default they "
        "are ignored, logged once per name and listed in the X-UMA-Ignored-Fields header)",
    )


def _add_logging_arguments(ap: argparse.ArgumentParser) -> None:
    """uvicorn's log level and the per-request access log."""
    ap.add_argument("--log-level", default="info", help="uvicorn log level")
    ap.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="text, or json: one JSON object a line (time, level, logger, message, request_id "
        "and core where a line has them), as umad's --log-format",
    )
    ap.add_argument(
        "--access-log",
        action="store_true",
        help="log a line per request (off by default: it sits on every response's first send; "
        "/metrics counts requests by route and status)",
    )


def settings_from(args: argparse.Namespace) -> Settings:
    """Settings from the parsed flags, each field from its flag's ``dest`` of the same name."""
    values = {f.name: getattr(args, f.name) for f in fields(Settings)}
    if values["api_keys"] is None:
        values["api_keys"] = env_list("UMA_API_KEY")
    values["core_sockets"] = values["core_sockets"] or env_list("UMA_SOCKET") or [DEFAULT_SOCKET]
    return Settings(**values)


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    settings = settings_from(args)
    if len(set(settings.core_sockets)) != len(settings.core_sockets):
        ap.error("--core-socket: a socket is given twice")
    if args.affinity_chars < 1 or args.balance_slack < 0 or args.health_interval <= 0:
        ap.error("--affinity-chars must be >= 1, --balance-slack >= 0, --health-interval > 0")
    if args.liveness_timeout <= 0:
        ap.error("--liveness-timeout must be > 0")
    app = create_app(settings)
    gc.collect()  # start-up objects out of the collector: no full-collection pauses over them
    gc.freeze()
    config = uvicorn.Config(
        # the cork reads uvicorn's own send (its socket): outermost
        cork_response_head(close_unread_body(app)),
        host=args.host,
        port=args.port,
        http=limited_protocol(args.max_header_bytes, args.header_timeout),
        log_level=args.log_level,
        log_config=log_config(args.log_format, args.log_level),
        access_log=args.access_log,
        timeout_keep_alive=args.keep_alive_timeout,
        # the Drain stops what still runs after --shutdown-grace; uvicorn cancels only later
        timeout_graceful_shutdown=int(args.shutdown_grace + STOP_MARGIN_S + 0.999),
        proxy_headers=False,
    )
    # after a drain on Ctrl-C uvicorn raises the signal again, which asyncio turns into a
    # KeyboardInterrupt: the shutdown was clean, so no traceback (as uvicorn.run does)
    with contextlib.suppress(KeyboardInterrupt):
        GatewayServer(config, app.state.drain).run()


if __name__ == "__main__":
    main()
