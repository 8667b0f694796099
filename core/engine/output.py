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

    def token(
        self, seq: Sequence, token: int, lp: p.Logprobs | None, now: int, out: list[Outgoing]
    ) -> str | None:
        """One sampled token of a running sequence, as its event(s). Returns the end it
        brought ("stop", "length"; its final event is made), or None: the token is the
        sequence's next one to decode."""
        req = seq.request
        if self.runtime.is_eog(token) and not req.ignore_eos:
            self.end(seq, "stop", now, out, token=token)
            return "stop"
        seq.generated += 1
        self._timing(seq, now)
        text = seq.text.push(self.runtime.piece(token))
        if seq.text.stopped:
            _emit_text(seq, text, token, lp, out)
            self.end(seq, "stop", now, out)
            return "stop"
        if seq.generated >= req.max_tokens or seq.n_past + 1 >= self.runtime.n_ctx_per_seq:
            _emit_text(seq, text + seq.text.flush(), token, lp, out)
            self.end(seq, "length", now, out)
            return "length"
        _emit_text(seq, text, token, lp, out)
        seq.next_token = token
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
