"""A streaming OpenAI completions client as light as the socket client library.

`bench ipc-overhead` asks what the gateway adds. httpx (the OpenAI SDK's transport) spends
several times the socket client's CPU per request and per token on this machine, and that
cost would be charged to the gateway. This client keeps one keep-alive connection, writes the
request in one send and parses the response with httptools (uvicorn's C parser) and msgspec:
the HTTP path's client then costs about what the socket path's does.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import httptools
import msgspec

from uma_serve.bench.targets import OnToken, RequestResult, RequestSpec, Target, take_chunk


class _Response:
    """httptools callbacks: the status, SSE events as they complete, the end of the message."""

    def __init__(self) -> None:
        self.buffer = b""
        self.events: list[bytes] = []
        self.complete = False
        self.keep_alive = True

    def on_body(self, body: bytes) -> None:
        self.buffer += body
        *done, self.buffer = self.buffer.split(b"\n\n")
        self.events.extend(done)

    def on_message_complete(self) -> None:
        self.complete = True


class LeanHttpTarget(Target):
    """POST /v1/completions with stream=true over one connection (requests one at a time)."""

    def __init__(self, base_url: str, name: str = "gateway") -> None:
        url = urlsplit(base_url)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self.name = name
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._lock = asyncio.Lock()

    def _request(self, spec: RequestSpec) -> bytes:
        body = msgspec.json.encode(
            {
                "prompt": spec.prompt,
                "max_tokens": spec.max_tokens,
                "temperature": spec.temperature,
                "seed": spec.seed,
                "stream": True,
                "stream_options": {"include_usage": True},
                "ignore_eos": spec.ignore_eos,
            }
            | ({"qos": spec.qos} if spec.qos else {})
        )
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    async def generate(self, spec: RequestSpec, on_token: OnToken | None = None) -> RequestResult:
        async with self._lock:
            return await self._generate(spec, on_token)

    async def _generate(self, spec: RequestSpec, on_token: OnToken | None) -> RequestResult:
        if self._conn is None:
            self._conn = await asyncio.open_connection(self.host, self.port)
        reader, writer = self._conn
        request = self._request(spec)
        response = _Response()
        parser = httptools.HttpResponseParser(response)
        res = RequestResult(spec=spec, t_send=time.perf_counter())
        try:
            writer.write(request)
            while not response.complete:
                data = await reader.read(1 << 16)
                if not data:
                    raise ConnectionError("the server closed the connection")
                parser.feed_data(data)
                now = time.perf_counter()
                for event in response.events:
                    if not event.startswith(b"data: ") or event == b"data: [DONE]":
                        continue
                    take_chunk(res, msgspec.json.decode(event[6:]), now, on_token)
                response.events.clear()
            if parser.get_status_code() != 200:
                res.error = f"HTTP {parser.get_status_code()}: {response.buffer[:300]!r}"
            if not parser.should_keep_alive():
                await self.aclose()
        except Exception as e:  # noqa: BLE001 (a failed request is a result, not a crash)
            res.error = f"{type(e).__name__}: {e}"
            await self.aclose()
        return res

    async def aclose(self) -> None:
        if self._conn is not None:
            self._conn[1].close()
            self._conn = None
