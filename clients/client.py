"""Socket client library for the core: async (multiplexed) and sync (one request at a time).

The async client keeps one connection and many requests in flight, told apart by id; a
reader task routes each event to its request's queue. The gateway and the bench use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgspec

from uma_serve.core import protocol as p
from uma_serve.core.socket_path import check_peer, default_socket

# umad's default (core/socket_path.py); a socket served by another user is refused
DEFAULT_SOCKET = os.environ.get("UMA_SOCKET") or default_socket()
_FINAL = (p.EosEvent, p.CompletionEvent, p.ErrorEvent)
# a request too big for the core's --max-frame-bytes, refused here and never sent: the core
# would close the connection, ending every other request multiplexed on it
E_TOO_BIG = "E_CLIENT_001"
# the client's own code (not the core's): a frame from the core that does not decode
E_BAD_REPLY = "E_BAD_REPLY"
# the requests answered by one event (no generation)
AdminRequest = (
    p.InfoRequest | p.HealthRequest | p.MetricsRequest | p.TokenizeRequest | p.DetokenizeRequest
)


class CoreError(Exception):
    """An ``error`` event from the core, or a lost connection (code E_IO_001)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def _undecodable(exc: Exception) -> CoreError:
    return CoreError(E_BAD_REPLY, f"undecodable event from the core: {exc}")


def new_id() -> str:
    return uuid.uuid4().hex


class AsyncUmaClient:
    """One connection to the core; many concurrent requests over it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._queues: dict[str, asyncio.Queue[p.Event | CoreError]] = {}
        self._admin_ids = (f"admin-{n}" for n in itertools.count())
        self._reader_task = asyncio.create_task(self._read_loop())
        self.closed = False
        self.max_frame_bytes = 0  # the core's, from its info (0: unknown, nothing refused)

    @classmethod
    async def connect(cls, path: str = DEFAULT_SOCKET) -> AsyncUmaClient:
        """A connection that knows the core's frame limit (one ``info`` round trip)."""
        reader, writer = await asyncio.open_unix_connection(path, limit=p.DEFAULT_MAX_FRAME)
        try:
            check_peer(writer.get_extra_info("socket"), path)  # before anything is sent
        except OSError:
            writer.close()
            raise
        client = cls(reader, writer)
        try:
            await client.info()
        except BaseException:
            await client.close()
            raise
        return client

    async def _read_loop(self) -> None:
        reason = CoreError(p.E_IO, "connection to the core closed")
        try:
            while True:
                payload = await p.read_frame(self._reader, 1 << 30)
                try:
                    event = p.decode_event(payload)
                except msgspec.DecodeError as exc:
                    self._fail_request(payload, exc)
                    continue
                if isinstance(event, p.InfoEvent):
                    self.max_frame_bytes = event.max_frame_bytes
                queue = self._queues.get(event.id) if event.id is not None else None
                if queue is not None:
                    queue.put_nowait(event)
                elif isinstance(event, p.ErrorEvent):
                    reason = CoreError(event.code, event.message)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except Exception as exc:  # a frame no request can be told from: the stream is unusable
            reason = _undecodable(exc)
        finally:
            self.closed = True
            for queue in self._queues.values():
                queue.put_nowait(reason)

    def _fail_request(self, payload: bytes, exc: msgspec.DecodeError) -> None:
        """An event the client cannot decode ends its own request, cancelled in the core, not
        the connection and every request on it: frames are length-prefixed, so the next one
        reads as it should. A frame whose request cannot be told re-raises ``exc``."""
        try:
            rid = msgspec.json.decode(payload).get("id")
        except (msgspec.DecodeError, AttributeError):
            raise exc from None
        if not isinstance(rid, str):
            raise exc
        queue = self._queues.get(rid)
        if queue is not None:  # else its request has ended: the event is dropped
            queue.put_nowait(_undecodable(exc))
            self._cancel_now(rid)

    def _cancel_now(self, rid: str) -> None:
        """Cancel ``rid`` in the core without waiting (from a finally block or the reader):
        best effort, as a closing connection has nothing left to cancel."""
        with contextlib.suppress(Exception):
            self._writer.write(p.encode(p.Cancel(id=rid)))

    def _frame(self, msg: Any) -> bytes:
        """``msg`` framed, or CoreError(E_TOO_BIG) for a frame over the core's limit: that
        request alone fails, the connection and its other requests go on."""
        data = p.encode(msg)
        size, limit = len(data) - p.HEADER.size, self.max_frame_bytes
        if limit and size > limit:
            raise CoreError(E_TOO_BIG, f"request of {size} bytes is over the core's limit {limit}")
        return data

    async def _send(self, msg: Any) -> None:
        data = msg if isinstance(msg, bytes) else self._frame(msg)
        if self.closed:
            raise CoreError(p.E_IO, "connection to the core closed")
        self._writer.write(data)
        await self._writer.drain()

    async def stream(self, request: p.Generate) -> AsyncIterator[p.Event]:
        """Send a generation and yield its events up to and including the final one.

        Raises CoreError for an ``error`` event or a lost connection. Leaving the loop early
        (break, exception, task cancellation) cancels the request in the core.
        """
        data = self._frame(request)  # before anything is registered or sent
        queue: asyncio.Queue[p.Event | CoreError] = asyncio.Queue()
        self._queues[request.id] = queue
        done = False
        try:
            await self._send(data)
            while True:
                item = await queue.get()
                if isinstance(item, CoreError):
                    done = True
                    raise item
                if isinstance(item, p.ErrorEvent):
                    done = True
                    raise CoreError(item.code, item.message)
                if isinstance(item, _FINAL):
                    done = True
                yield item
                if done:
                    return
        finally:
            self._queues.pop(request.id, None)
            if not done and not self.closed:
                self._cancel_now(request.id)

    async def stream_group(self, request: p.Generate) -> AsyncIterator[tuple[int, p.Event]]:
        """A request with ``n`` > 1 (admitted whole or refused whole by the core): each of its
        sequences' events, tagged with the sequence's index, up to the last final one.

        Raises CoreError for the first error of any sequence; leaving early cancels those
        still running."""
        data = self._frame(request)
        ids = {f"{request.id}-{i}": i for i in range(request.n)}
        queue: asyncio.Queue[p.Event | CoreError] = asyncio.Queue()  # one for all n
        self._queues.update(dict.fromkeys(ids, queue))
        running = set(ids)
        try:
            await self._send(data)
            while running:
                item = await queue.get()
                if isinstance(item, CoreError):
                    raise item
                if isinstance(item, p.ErrorEvent):
                    running.discard(item.id or "")
                    raise CoreError(item.code, item.message)
                if isinstance(item, _FINAL):
                    running.discard(item.id or "")
                yield ids[item.id or ""], item
        finally:
            for rid in ids:
                self._queues.pop(rid, None)
            if not self.closed:
                for rid in running:
                    self._cancel_now(rid)

    async def complete(self, request: p.Generate) -> p.CompletionEvent | p.EosEvent:
        """Run a generation to its end; return the final event (text joined if streamed)."""
        last: p.Event | None = None
        async for event in self.stream(request):
            last = event
        assert isinstance(last, p.CompletionEvent | p.EosEvent)
        return last

    async def cancel(self, request_id: str) -> None:
        await self._send(p.Cancel(id=request_id))

    async def _admin(self, kind: type, **kw: Any) -> Any:
        return await self.ask(kind(**kw))

    async def ask(self, request: AdminRequest) -> p.Event:
        """One admin request (its id is set here) and the event that answers it."""
        rid = next(self._admin_ids)
        queue: asyncio.Queue[p.Event | CoreError] = asyncio.Queue()
        self._queues[rid] = queue
        try:
            await self._send(msgspec.structs.replace(request, id=rid))
            item = await queue.get()
        finally:
            self._queues.pop(rid, None)
        if isinstance(item, CoreError):
            raise item
        if isinstance(item, p.ErrorEvent):
            raise CoreError(item.code, item.message)
        return item

    async def metrics(self) -> dict[str, Any]:
        return (await self._admin(p.MetricsRequest)).metrics

    async def health(self) -> p.HealthEvent:
        return await self._admin(p.HealthRequest)

    async def info(self) -> p.InfoEvent:
        return await self._admin(p.InfoRequest)

    async def tokenize(self, content: str, **kw: bool) -> p.TokensEvent:
        """``kw``: add_special, parse_special, with_pieces (docs/PROTOCOL.md)."""
        return await self._admin(p.TokenizeRequest, content=content, **kw)

    async def detokenize(self, tokens: list[int]) -> str:
        return (await self._admin(p.DetokenizeRequest, tokens=tokens)).content

    async def close(self) -> None:
        self._reader_task.cancel()
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
        self.closed = True


class UmaClient:
    """Blocking client: one request at a time on one connection (for scripts and uma-cli)."""

    def __init__(self, path: str = DEFAULT_SOCKET, timeout: float | None = None) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(path)
            check_peer(self._sock, path)  # before anything is sent
        except OSError:
            self._sock.close()
            raise

    def __enter__(self) -> UmaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def send(self, msg: Any) -> None:
        self._sock.sendall(p.encode(msg))

    def send_raw(self, data: bytes) -> None:
        self._sock.sendall(data)

    def _read_exactly(self, n: int) -> bytes:
        chunks, got = [], 0
        while got < n:
            chunk = self._sock.recv(n - got)
            if not chunk:
                raise CoreError(p.E_IO, "connection to the core closed")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def read_event(self) -> p.Event:
        (length,) = p.HEADER.unpack(self._read_exactly(p.HEADER.size))
        return p.decode_event(self._read_exactly(length))

    def stream(self, request: p.Generate) -> Iterator[p.Event]:
        """Yield a generation's events up to the final one; raise CoreError on an error."""
        self.send(request)
        while True:
            event = self.read_event()
            if event.id != request.id:
                continue
            if isinstance(event, p.ErrorEvent):
                raise CoreError(event.code, event.message)
            yield event
            if isinstance(event, _FINAL):
                return

    def complete(self, request: p.Generate) -> p.CompletionEvent | p.EosEvent:
        events = list(self.stream(request))
        last = events[-1]
        assert isinstance(last, p.CompletionEvent | p.EosEvent)
        return last

    def request(self, msg: Any) -> p.Event:
        """Send an admin request (metrics, health, info) and return its answer."""
        self.send(msg)
        while True:
            event = self.read_event()
            if event.id == msg.id:
                if isinstance(event, p.ErrorEvent):
                    raise CoreError(event.code, event.message)
                return event

    def metrics(self) -> dict[str, Any]:
        return self.request(p.MetricsRequest(id=new_id())).metrics

    def health(self) -> p.HealthEvent:
        return self.request(p.HealthRequest(id=new_id()))

    def info(self) -> p.InfoEvent:
        return self.request(p.InfoRequest(id=new_id()))

    def tokenize(self, content: str, **kw: bool) -> p.TokensEvent:
        msg = p.TokenizeRequest(id=new_id(), content=content, **kw)
        return self.request(msg)

    def detokenize(self, tokens: list[int]) -> str:
        msg = p.DetokenizeRequest(id=new_id(), tokens=tokens)
        return self.request(msg).content
