"""What a bench drives: UMA's core over its socket, or any OpenAI-compatible HTTP server.

Every request yields a RequestResult with the arrival time of each content chunk relative to
the send time (ms), so all metrics come from the same client-side clock whatever the server.
Token counts come from the server's `usage` when it reports one (UMA's core, and HTTP servers
that honour `stream_options.include_usage`), else from the number of content chunks.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from uma_serve.clients.client import AsyncUmaClient, new_id
from uma_serve.core import protocol as p

OnToken = Callable[[float], None]  # called with the absolute perf_counter time of a chunk


@dataclass
class RequestSpec:
    prompt: str
    max_tokens: int
    qos: str | None = None  # a UMA label ("background"); None: none, as plain clients send
    seed: int = 0
    # UMA_BENCH_TEMPERATURE overrides it for every scenario (0 = greedy on every server)
    temperature: float = field(
        default_factory=lambda: float(os.environ.get("UMA_BENCH_TEMPERATURE", "0.8"))
    )
    ignore_eos: bool = True
    tag: str = ""  # the scenario's label for this request (class, session, step ...)
    grammar: str | None = None  # GBNF constraining the output (llama-server's field)
    # a chat instead of a completion: OpenAI messages (role, content, tool_calls, ...)
    messages: list[dict] | None = None


@dataclass
class RequestResult:
    spec: RequestSpec
    t_send: float  # perf_counter seconds
    token_ms: list[float] = field(default_factory=list)  # content chunk arrivals, ms after send
    texts: list[str] = field(default_factory=list)
    completion_tokens: int | None = None  # from usage
    prompt_tokens: int | None = None  # from usage
    cached_tokens: int | None = None  # prompt tokens the server's prefix cache served
    error: str | None = None
    finish_reason: str | None = None
    # the daemon's own account (UMA's socket target only): arrival -> admitted, -> first token
    server_queue_ms: float | None = None
    server_ttft_ms: float | None = None

    @property
    def n_tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens else len(self.token_ms)

    @property
    def text(self) -> str:
        return "".join(self.texts)

    @property
    def ok(self) -> bool:
        return self.error is None and self.n_tokens > 0


class Target:
    """A server to drive. `name` labels rows and tables."""

    name: str = "target"
    kind: str = "http"

    async def generate(self, spec: RequestSpec, on_token: OnToken | None = None) -> RequestResult:
        raise NotImplementedError

    async def aclose(self) -> None:
        return None


class SocketTarget(Target):
    """UMA's core over its Unix socket (the client library), one shared connection."""

    kind = "socket"

    def __init__(self, socket_path: str, name: str = "uma-socket") -> None:
        self.socket_path = socket_path
        self.name = name
        self._client: AsyncUmaClient | None = None

    async def _get(self) -> AsyncUmaClient:
        if self._client is None:
            self._client = await AsyncUmaClient.connect(self.socket_path)
        return self._client

    async def generate(self, spec: RequestSpec, on_token: OnToken | None = None) -> RequestResult:
        client = await self._get()
        req = p.Generate(
            id=new_id(),
            prompt=None if spec.messages else spec.prompt,
            messages=[core_message(m) for m in spec.messages] if spec.messages else None,
            max_tokens=spec.max_tokens,
            temperature=spec.temperature,
            seed=spec.seed % (1 << 32),
            ignore_eos=spec.ignore_eos,
            qos=spec.qos or "interactive",  # type: ignore[arg-type]
            stream=True,
            grammar=spec.grammar,
        )
        t0 = time.perf_counter()
        res = RequestResult(spec=spec, t_send=t0)
        try:
            async with contextlib.aclosing(client.stream(req)) as events:
                async for ev in events:
                    now = time.perf_counter()
                    if isinstance(ev, p.TokenEvent):
                        if ev.text:
                            res.token_ms.append((now - t0) * 1000.0)
                            res.texts.append(ev.text)
                            if on_token:
                                on_token(now)
                    elif isinstance(ev, p.EosEvent):
                        res.completion_tokens = ev.usage.completion_tokens
                        res.prompt_tokens = ev.usage.prompt_tokens
                        res.cached_tokens = ev.usage.cached_tokens
                        res.finish_reason = ev.reason
                        res.server_queue_ms = ev.timings.queue_ms
                        res.server_ttft_ms = ev.timings.ttft_ms
                        if ev.reason == "error":
                            res.error = ev.detail or "error"
                    elif isinstance(ev, p.ErrorEvent):
                        res.error = f"{ev.code}: {ev.message}"
        except Exception as e:  # noqa: BLE001 (a failed request is a result, not a crash)
            res.error = f"{type(e).__name__}: {e}"
        return res

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def core_message(m: dict) -> p.Message:
    """An OpenAI message as the core's (role, text): tool calls and results as text, as the
    gateway's documented fallback renders them for a template without tools."""
    if m["role"] == "tool":
        return p.Message("user", f"Tool result ({m.get('tool_call_id')}): {m['content']}")
    calls = "".join(
        f"<tool_call>\n{json.dumps(c['function'])}\n</tool_call>" for c in m.get("tool_calls") or ()
    )
    return p.Message(m["role"], (m.get("content") or "") + calls)


class HttpTarget(Target):
    """Any OpenAI-compatible server: streaming POST /v1/completions, SSE parsed by hand."""

    def __init__(
        self,
        base_url: str,
        name: str = "http",
        *,
        send_ignore_eos: bool = True,
        send_qos: bool = False,
        send_usage: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.name = name
        self.send_ignore_eos = send_ignore_eos
        self.send_qos = send_qos
        self.send_usage = send_usage
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(None, connect=30.0),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )

    def body(self, spec: RequestSpec) -> dict:
        body: dict = {
            **({"messages": spec.messages} if spec.messages else {"prompt": spec.prompt}),
            "max_tokens": spec.max_tokens,
            "temperature": spec.temperature,
            "seed": spec.seed,
            "stream": True,
        }
        if self.send_usage:
            body["stream_options"] = {"include_usage": True}
        if self.send_ignore_eos and spec.ignore_eos:
            body["ignore_eos"] = True
        if self.send_qos and spec.qos:
            body["qos"] = spec.qos
        if spec.grammar:
            body["grammar"] = spec.grammar
        return body

    async def generate(self, spec: RequestSpec, on_token: OnToken | None = None) -> RequestResult:
        body = self.body(spec)
        t0 = time.perf_counter()
        res = RequestResult(spec=spec, t_send=t0)
        path = "/v1/chat/completions" if spec.messages else "/v1/completions"
        try:
            async with self._http.stream("POST", path, json=body) as r:
                if r.status_code != 200:
                    res.error = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
                    return res
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    take_chunk(res, json.loads(data), time.perf_counter(), on_token)
        except Exception as e:  # noqa: BLE001
            res.error = f"{type(e).__name__}: {e}"
        return res

    async def aclose(self) -> None:
        await self._http.aclose()


def take_chunk(res: RequestResult, chunk: dict, now: float, on_token: OnToken | None) -> None:
    """Record one streamed OpenAI completions or chat chunk (content, finish reason, usage,
    error)."""
    if "error" in chunk:
        res.error = str(chunk["error"])[:300]
        return
    for choice in chunk.get("choices") or []:
        text = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
        if text:
            res.token_ms.append((now - res.t_send) * 1000.0)
            res.texts.append(text)
            if on_token:
                on_token(now)
        if choice.get("finish_reason"):
            res.finish_reason = choice["finish_reason"]
    usage = chunk.get("usage")
    if usage:
        res.completion_tokens = usage.get("completion_tokens")
        res.prompt_tokens = usage.get("prompt_tokens")
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            res.cached_tokens = details["cached_tokens"]
    timings = chunk.get("timings")  # llama-server's own account of its cache
    if timings and timings.get("cache_n") is not None:
        res.cached_tokens = timings["cache_n"]
