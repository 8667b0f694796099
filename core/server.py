"""The asyncio side of the daemon: the Unix socket, framing, validation, dispatch of events.

One Connection per client socket. Requests are validated and tokenized here, then handed to
the engine; the engine's events come back in one batch per tick (``deliver``) and are written
to their connections. Never blocks on a slow client: a connection whose unread output (any
reply) passes ``max_write_buffer_bytes`` has its requests cancelled with E_IO_001 and is
closed. On a signal the daemon drains (``drain``) before ``shutdown``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import version

from uma_serve.core import chat_extras, protocol as p
from uma_serve.core.chat import ChatTemplate, ChatTemplateError, normalize
from uma_serve.core.config import Config
from uma_serve.core.engine import Engine, Outgoing, Submission
from uma_serve.core.group import members
from uma_serve.core.limits import over_limits, over_prompt_bytes
from uma_serve.core.prompt_tokens import ChatTokenizer, PromptTokenizer
from uma_serve.core.runtime import Runtime
from uma_serve.core.runtime.grammar import GrammarError, check_grammar

log = logging.getLogger("uma.server")
_conn_ids = itertools.count(1)
# an overflowed connection's queued bytes and last error may take this long to be read
# before the connection is dropped (its memory is then freed whatever the client does)
CLOSE_GRACE_S = 60.0


@dataclass(eq=False)
class Connection:
    writer: asyncio.StreamWriter
    limit: int  # unread bytes queued at most (--max-write-buffer-bytes)
    on_overflow: Callable[[Connection], None]
    id: int = field(default_factory=lambda: next(_conn_ids))
    inflight: set[str] = field(default_factory=set)
    overflowed: bool = False
    abort_timer: asyncio.TimerHandle | None = None  # an overflowed one's deadline to close

    def send(self, event: p.Event) -> None:
        self.write(p.encode(event))

    def write(self, data: bytes) -> None:
        """Every reply passes here (tokens, admin answers, errors), so the bound on what a
        client leaves unread covers them all."""
        if self.overflowed or self.writer.is_closing():
            return
        self.writer.write(data)
        if self.buffered > self.limit:
            self.on_overflow(self)

    @property
    def buffered(self) -> int:
        transport = self.writer.transport
        return transport.get_write_buffer_size() if transport else 0


class CoreServer:
    def __init__(
        self, config: Config, runtime: Runtime, engine: Engine, chat: ChatTemplate | None
    ) -> None:
        self.config = config
        self.runtime = runtime
        self.engine = engine
        self.chat = chat
        self.tokenizer = PromptTokenizer(runtime)  # reuses a recent prompt's tokens
        self.chat_tokenizer = ChatTokenizer(runtime)  # reuses earlier messages' tokens
        self.connections: dict[int, Connection] = {}
        self.draining = False
        self._drained: asyncio.Event | None = None  # set once draining with nothing in flight
        self._tasks: set[asyncio.Task[None]] = set()  # the connections' handlers
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- engine -> clients ----

    def sink(self, batch: list[Outgoing]) -> None:
        """Called on the engine thread once per tick: hand the batch to the loop."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.deliver, batch)

    def deliver(self, batch: list[Outgoing]) -> None:
        """One write per connection per tick: a client multiplexing many streams (the
        gateway) then wakes once a tick, not once a token."""
        frames: dict[Connection, list[bytes]] = {}
        for conn_id, event in batch:
            conn = self.connections.get(conn_id)
            if conn is None:
                continue
            if isinstance(event, p.EosEvent | p.CompletionEvent | p.ErrorEvent):
                conn.inflight.discard(event.id or "")
            if not conn.overflowed:
                frames.setdefault(conn, []).append(p.encode(event))
        for conn, chunks in frames.items():
            conn.write(b"".join(chunks))
        self._check_drained()

    def _check_drained(self) -> None:
        if (
            self.draining
            and self._drained
            and not any(c.inflight for c in self.connections.values())
        ):
            self._drained.set()

    def _overflow(self, conn: Connection) -> None:
        """The client stopped reading: cancel its requests, tell it why, close the connection.
        Closing (not just muting) it means no later request is computed and never delivered."""
        conn.overflowed = True
        limit = self.config.max_write_buffer_bytes
        log.warning(
            "connection %d: %d unread bytes (over %d): cancelling its requests, closing it",
            conn.id,
            conn.buffered,
            limit,
        )
        msg = f"client did not read its stream (over {limit} bytes queued): closing the connection"
        ids: list[str | None] = [*sorted(conn.inflight)] or [None]
        errors = [p.encode(p.ErrorEvent(id=rid, code=p.E_IO, message=msg)) for rid in ids]
        conn.writer.write(b"".join(errors))  # past the bound: the last words
        if conn.inflight:
            conn.inflight.clear()
            self.engine.cancel_connection(conn.id)
            self._check_drained()
        conn.writer.close()  # stops reading now; closes once the client has read the rest
        assert self._loop is not None
        # cancelled once the connection is gone (_handle): aborting a transport that has
        # closed after writing its buffer raises in the loop (asyncio's _force_close)
        conn.abort_timer = self._loop.call_later(CLOSE_GRACE_S, conn.writer.transport.abort)

    # ---- clients -> engine ----

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._drained = asyncio.Event()
        old_umask = os.umask(0o177)  # the socket is born 0600: no window with wider rights
        try:
            self._server = await asyncio.start_unix_server(
                self._handle, path=self.config.socket, limit=self.config.max_frame_bytes + 8
            )
        finally:
            os.umask(old_umask)
        os.chmod(self.config.socket, 0o600)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(writer, self.config.max_write_buffer_bytes, self._overflow)
        self.connections[conn.id] = conn
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(conn, reader)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:  # shutdown: the connection is closed below
            pass
        finally:
            self._tasks.discard(task)
            self.connections.pop(conn.id, None)
            if conn.inflight:
                self.engine.cancel_connection(conn.id)
            self._check_drained()
            writer.close()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await writer.wait_closed()
        if conn.abort_timer is not None:
            conn.abort_timer.cancel()

    async def _serve(self, conn: Connection, reader: asyncio.StreamReader) -> None:
        idle = self.config.idle_timeout
        while True:
            timeout = idle if idle > 0 and not conn.inflight else None
            try:
                payload = await asyncio.wait_for(
                    p.read_frame(reader, self.config.max_frame_bytes), timeout
                )
            except TimeoutError:
                conn.send(p.ErrorEvent(id=None, code=p.E_IDLE, message=f"idle for {idle:g} s"))
                return
            except p.ProtocolError as exc:  # frame too large: answered, then closed
                conn.send(p.ErrorEvent(id=None, code=exc.code, message=exc.message))
                await conn.writer.drain()
                return
            arrival = time.monotonic_ns()
            try:
                request = p.decode_request(payload)
            except p.ProtocolError as exc:
                conn.send(p.ErrorEvent(id=exc.request_id, code=exc.code, message=exc.message))
                continue
            if conn.overflowed:  # closing: what the client sent after is not served
                return
            try:
                self._dispatch(conn, request, arrival)
            except Exception as exc:  # a bug must cost one request, not the connection
                log.exception("request handling failed")
                rid = getattr(request, "id", None)
                if isinstance(request, p.Generate):
                    conn.inflight.discard(request.id)
                conn.send(p.ErrorEvent(id=rid, code=p.E_RUNTIME, message=f"internal error: {exc}"))

    def _dispatch(self, conn: Connection, request: p.Request, arrival_ns: int) -> None:
        match request:
            case p.Generate():
                subs = members(request)  # n > 1: all admitted, or all refused (core/group.py)
                error = self._admit(conn, request, arrival_ns, subs)
                if error is not None:
                    for sub in subs:
                        conn.send(p.ErrorEvent(id=sub.id, code=error[0], message=error[1]))
            case p.Cancel(id=rid):
                if rid in conn.inflight:
                    self.engine.cancel((conn.id, rid))
            case p.MetricsRequest(id=rid):
                reused = self.tokenizer.reused_tokens_total  # the I/O thread's own figure
                conn.send(p.MetricsEvent(id=rid, metrics=self.engine.metrics.snapshot(reused)))
            case p.HealthRequest(id=rid):
                m = self.engine.metrics
                status = "draining" if self.draining else "ok" if self.engine.alive else "error"
                conn.send(p.HealthEvent(rid, status, m.active_sessions, m.waiting_sessions))
            case p.InfoRequest(id=rid):
                conn.send(self.info(rid))
            case p.TokenizeRequest() | p.DetokenizeRequest():
                conn.send(self.tokens(request))

    def _admit(
        self, conn: Connection, req: p.Generate, arrival_ns: int, subs: list[p.Generate]
    ) -> tuple[str, str] | None:
        """Submit the request (its ``subs``) to the engine, or the (code, message) refusing it."""
        refusal = self._limits(conn, req, subs)
        if refusal is not None:
            return refusal
        if req.messages is not None:
            if self.chat is None:
                return p.E_MODEL, "the model has no chat template: send a prompt instead"
            try:
                turns = normalize([(m.role, m.content) for m in req.messages])
                parts = self.chat.render_parts(turns, req.chat_template_kwargs)
            except ChatTemplateError as exc:
                return p.E_TEMPLATE, f"the chat template refused the messages: {exc}"
            prefill = [(req.prefill, False)] if req.prefill else []  # plain text, as content
            tokens = self.chat_tokenizer.tokenize(parts + prefill)  # content never markup
        else:
            tokens = self.tokenizer.tokenize((req.prompt or "") + (req.prefill or ""))
        if not tokens:
            return p.E_PROTO, "the prompt is empty"
        room = self.runtime.n_ctx_per_seq
        if len(tokens) + 1 > room:
            return (
                p.E_LIMIT,
                f"prompt of {len(tokens)} tokens does not fit the context ({room} per sequence)",
            )
        for sub in subs:
            conn.inflight.add(sub.id)
            self.engine.submit(Submission((conn.id, sub.id), sub, list(tokens), arrival_ns))
        return None

    def _limits(
        self, conn: Connection, req: p.Generate, subs: list[p.Generate]
    ) -> tuple[str, str] | None:
        """What refuses a request before its prompt is tokenized: the daemon's state, the
        configured limits, values the model cannot take."""
        c = self.config
        if self.draining:
            return p.E_SHUTDOWN, "the daemon is shutting down"
        if not self.engine.alive:
            return p.E_RUNTIME, "the engine has stopped (see the daemon log): restart umad"
        if dup := next((s.id for s in subs if s.id in conn.inflight), None):
            return p.E_DUP_ID, f"request id {dup!r} is already in flight on this connection"
        if self.in_flight() + len(subs) > c.max_sessions:
            held = f"{self.in_flight()} requests in flight"
            return p.E_BUSY, f"{held}, room for {len(subs)} more is over max_sessions: retry later"
        if over := over_limits(req, c.max_tokens, c.max_prompt_bytes, self.runtime.n_vocab):
            return over.code, over.message
        if (extras := chat_extras.problem(req)) is not None:
            return p.E_PROTO, f"invalid generate request: {extras}"
        if req.grammar is not None:
            try:
                check_grammar(self.runtime.vocab, req.grammar)
            except GrammarError as exc:
                return p.E_PROTO, f"invalid generate request: 'grammar': {exc}"
        return None

    def tokens(self, req: p.TokenizeRequest | p.DetokenizeRequest) -> p.Event:
        """``tokenize`` / ``detokenize`` (llama-server's /tokenize and /detokenize)."""
        rt = self.runtime
        if isinstance(req, p.DetokenizeRequest):
            bad = [t for t in req.tokens if not 0 <= t < rt.n_vocab]
            if bad:
                vocab = f"(0..{rt.n_vocab - 1})"
                return p.ErrorEvent(req.id, p.E_PROTO, f"token id {bad[0]} is not in {vocab}")
            text = b"".join(rt.piece(t, special=True) for t in req.tokens)
            return p.TextEvent(req.id, text.decode("utf-8", "replace"))
        if over := over_prompt_bytes(len(req.content.encode()), self.config.max_prompt_bytes):
            return p.ErrorEvent(req.id, over.code, over.message)
        ids = rt.tokenize(req.content, req.add_special, req.parse_special)
        if not req.with_pieces:
            return p.TokensEvent(req.id, ids)
        pieces: list[str | list[int]] = []
        for t in ids:
            raw = rt.piece(t, special=True)
            try:
                pieces.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                pieces.append(list(raw))
        return p.TokensEvent(req.id, ids, pieces)

    def info(self, rid: str | None) -> p.InfoEvent:
        rt = self.runtime
        return p.InfoEvent(
            id=rid,
            model=rt.model_name,
            model_path=rt.model_path,
            n_ctx=sum(sh.runtime.n_ctx for sh in self.engine.shards),  # every context's
            n_ctx_per_seq=rt.n_ctx_per_seq,
            n_seq=sum(sh.runtime.params.n_seq for sh in self.engine.shards),
            n_vocab=rt.n_vocab,
            chat_template=self.chat is not None,
            version=version("uma-serve"),
            max_tokens=self.config.max_tokens,
            max_prompt_bytes=self.config.max_prompt_bytes,
            gguf_chat_template=rt.info.chat_template is not None,
            max_frame_bytes=self.config.max_frame_bytes,
        )

    # ---- shutdown ----

    async def drain(self, timeout: float, interrupted: asyncio.Event) -> str | None:
        """Take no new generations (E_SHUTDOWN_001); wait for those in flight to finish, at
        most ``timeout`` seconds or until ``interrupted``. Returns why the wait was cut short,
        or None when nothing is left. Connections stay open: health answers "draining"."""
        assert self._drained is not None
        self.draining = True
        self._check_drained()
        waits = [asyncio.ensure_future(e.wait()) for e in (self._drained, interrupted)]
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        if self._drained.is_set():
            return None
        if interrupted.is_set():
            return "a second signal ended the drain"
        return f"the drain timed out after {timeout:g} s"

    def in_flight(self) -> int:
        return sum(len(c.inflight) for c in self.connections.values())

    async def shutdown(self, reason: str) -> None:
        """Stop accepting, end in-flight requests with an eos saying why, flush, remove socket."""
        self.draining = True
        if self._server is not None:
            self._server.close()
        self.engine.stop(reason)
        await asyncio.to_thread(self.engine.join, 10.0)
        await asyncio.sleep(0)  # let the engine's last call_soon_threadsafe batch run
        for conn in list(self.connections.values()):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.writer.drain(), 2.0)
            conn.writer.close()
        for task in list(self._tasks):  # their reads end quietly, no task left to asyncio.run
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.config.socket)
