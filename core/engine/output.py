"""The output step: a tick's sampled tokens as events.

Each token becomes UTF-8-safe text, checked against the request's stop strings, its
``max_tokens``, the context and end-of-generation; a request's end flushes the text held back,
records the request's metrics (TTFT and inter-token gaps as its tokens come) and makes its
final event. The scheduler says which sequences' tokens these are and retires the ones that
end (core/engine/scheduler.py); nothing here decides what runs.
"""

from __future__ import annotations

from uma_serve.core import protocol as p
from uma_serve.core.engine.sequence import Sequence
from uma_serve.core.engine.tick import Outgoing
from uma_serve.core.metrics import EngineMetrics
from uma_serve.core.policy.work import BACKGROUND, INTERACTIVE
from uma_serve.core.runtime.api import RuntimeApi


class Output:
    def __init__(self, runtime: RuntimeApi, metrics: EngineMetrics) -> None:
        self.runtime = runtime
        self.metrics = metrics
        # tokens whose output step waits for ``flush``: (sequence, token, logprobs, when drawn)
        self.pending: list[tuple[Sequence, int, p.Logprobs | None, int]] = []

    def take(
        self, seq: Sequence, token: int, lp: p.Logprobs | None, now: int, out: list[Outgoing]
    ) -> str | None:
        """A running sequence's sampled token. One that ends it (end of generation, its
        ``max_tokens``, the context) or is its first goes through the output step at once
        (as every token does under speculation, whose next drafts continue it): returns the
        end it brought, its final event made. Any other becomes the sequence's next token to
        decode, its text and events waiting for ``flush`` (after the next tick's launch, while
        the device computes it); returns None."""
        if self.runtime.is_eog(token) and not seq.request.ignore_eos:
            self.end(seq, "stop", now, out, token=token)
            return "stop"
        last = self._last(seq)
        if not last and seq.first_token_ns is not None and seq.ngrams is None:
            seq.next_token = token
            self.pending.append((seq, token, lp, now))
            return None
        reason = self._token(seq, token, lp, now, out, last)
        if reason is None:
            seq.next_token = token
        return reason

    def flush(self, out: list[Outgoing]) -> list[tuple[Sequence, str]]:
        """The waiting tokens' text and events; the sequences a stop string ended and why
        (their token is in the tick in flight: their KV holds it)."""
        pending, self.pending = self.pending, []
        ended = []
        for seq, token, lp, now in pending:
            reason = self._token(seq, token, lp, now, out, last=False)
            if reason is not None:
                seq.out.append(token)
                ended.append((seq, reason))
        return ended

    def _last(self, seq: Sequence) -> bool:
        """Whether the sequence's next token is its last: its ``max_tokens``, the context."""
        limit = seq.generated + 1 >= seq.request.max_tokens
        return limit or seq.n_past + 1 >= self.runtime.n_ctx_per_seq

    def _token(
        self,
        seq: Sequence,
        token: int,
        lp: p.Logprobs | None,
        now: int,
        out: list[Outgoing],
        last: bool,
    ) -> str | None:
        """One token through the output step (``last``: it is the sequence's last): its
        text, checked against the stop strings, as events; the end it brought (its final
        event made)."""
        seq.generated += 1
        self._timing(seq, now)
        text = seq.text.push(self.runtime.piece(token))
        if seq.text.stopped:
            _emit_text(seq, text, token, lp, out)
            self.end(seq, "stop", now, out)
            return "stop"
        if last:
            _emit_text(seq, text + seq.text.flush(), token, lp, out)
            self.end(seq, "length", now, out)
            return "length"
        _emit_text(seq, text, token, lp, out)
        seq.out.append(token)
        if seq.ngrams is not None:
            seq.ngrams.append(token)
        return None

    def _timing(self, seq: Sequence, now: int) -> None:
        """The token's count, and its TTFT (by the prompt's class) or inter-token gap."""
        self.metrics.tokens_generated_total += 1
        if seq.first_token_ns is None:
            seq.first_token_ns = now
            prompt_qos = INTERACTIVE if seq.interactive else BACKGROUND
            self.metrics.observe_ttft(prompt_qos, (now - seq.arrival_ns) * 1e-6)
        else:
            gap = (now - (seq.last_token_ns or now)) * 1e-6
            self.metrics.observe_itl(seq.request.qos, gap)
        seq.last_token_ns = now

    def end(
        self,
        seq: Sequence,
        reason: str,
        now: int,
        out: list[Outgoing],
        detail: str | None = None,
        token: int = -1,
        send: bool = True,
    ) -> None:
        """A request's end: the text a stop held back, its metrics and its final event."""
        if reason == "stop" and (rest := seq.text.flush()):
            _emit_text(seq, rest, token, None, out)
        m = self.metrics
        m.requests_total[reason] += 1
        m.e2e_ms.observe((now - seq.arrival_ns) * 1e-6)
        m.observe_request(len(seq.prompt), seq.generated, seq.request.max_tokens)
        m.observe_phases(seq.admitted_ns, seq.first_token_ns, now)
        if send:
            out.append((seq.conn_id, seq.final_event(reason, now, detail)))

    def fail(self, seq: Sequence, message: str, now: int, out: list[Outgoing]) -> None:
        """A request's end with an error event (E_RUNTIME) instead of its final event."""
        error = p.ErrorEvent(id=seq.request.id, code=p.E_RUNTIME, message=message)
        out.append((seq.conn_id, error))
        self.end(seq, "error", now, out, message, send=False)


def _emit_text(
    seq: Sequence, text: str, token: int, lp: p.Logprobs | None, out: list[Outgoing]
) -> None:
    event = seq.token_event(text, token, lp)
    if event is not None:
        out.append((seq.conn_id, event))
