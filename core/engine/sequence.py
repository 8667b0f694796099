"""One generation request in the engine: as the I/O thread hands it over (``Submission``) and
as the engine holds it from admission to its final event (``Sequence``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from uma_serve.core import protocol as p
from uma_serve.core.engine.tick import Draw
from uma_serve.core.policy import BatchItem, Phase, SessionView
from uma_serve.core.policy.work import BACKGROUND, INTERACTIVE
from uma_serve.core.prefix.index import block_hashes
from uma_serve.core.prefix.store import Reused
from uma_serve.core.runtime import Span
from uma_serve.core.sampling import SamplerState
from uma_serve.core.spec.ngram import NgramIndex
from uma_serve.core.textstream import TextStream

RequestKey = tuple[int, str]  # (connection id, request id)


class Submission(msgspec.Struct, frozen=True, tag=True):
    """A request as the I/O thread hands it over: tokenized, stamped on arrival."""

    key: RequestKey
    request: p.Generate
    prompt: list[int]
    arrival_ns: int
    prompt_hashes: list[int] = []  # its block hash chain (core/prefix/index.py), by submit


@dataclass(eq=False)
class Sequence:
    key: RequestKey
    request: p.Generate
    prompt: list[int]
    arrival_ns: int
    seq_id: int = -1
    sampler: SamplerState | None = None
    n_past: int = 0  # tokens in the KV cache
    next_token: int | None = None  # sampled, not yet decoded
    generated: int = 0
    admitted_ns: int | None = None
    prefill_done_ns: int | None = None
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    last_progress_ns: int = 0
    burst: int = 0  # consecutive ticks decoded
    out: list[int] = field(default_factory=list)  # emitted token ids (the KV holds prompt + out)
    ngrams: NgramIndex | None = None  # prompt-lookup drafting index (spec on)
    draft: tuple[int, ...] = ()  # this tick's proposal, shown to the policy
    spec_accept_ewma: float = 0.7  # per-token draft acceptance, smoothed (optimistic start)
    # its uncached prompt is longer than the interactive allowance (policy/work.py): the
    # prompt is bulk work; set on arrival from the prefix cache's answer, again on admission
    bulk_prompt: bool = False
    reused: Reused = Reused()  # what its leading KV was copied from (the prefix cache)
    prompt_hashes: list[int] = field(default_factory=list)  # block hash chain (prefix cache)
    text: TextStream = field(init=False)
    parts: list[str] = field(default_factory=list)  # the whole text, for stream: false
    logprobs: list[p.Logprobs] = field(default_factory=list)  # for stream: false

    def __post_init__(self) -> None:
        self.text = TextStream(self.request.stops)
        if not self.prompt_hashes:  # (submit computes them on the I/O thread)
            self.prompt_hashes = block_hashes(self.prompt)

    @property
    def conn_id(self) -> int:
        return self.key[0]

    @property
    def pending_prefill(self) -> int:
        return max(len(self.prompt) - self.n_past, 0)

    @property
    def phase(self) -> Phase:
        return Phase.PREFILL if self.pending_prefill else Phase.DECODE

    @property
    def interactive(self) -> bool:
        """A chat turn: not labeled background, and its prompt within the allowance."""
        return self.request.qos != BACKGROUND and not self.bulk_prompt

    @property
    def work_class(self) -> str:
        """The class of the work it brings to the next tick: its prompt's class while
        prefilling, its label's once decoding (every unlabeled stream is protected)."""
        if self.request.qos == BACKGROUND or (self.bulk_prompt and self.pending_prefill):
            return BACKGROUND
        return INTERACTIVE

    def view(self) -> SessionView:
        return SessionView(
            seq_id=self.seq_id,
            phase=self.phase,
            qos=self.work_class,
            prompt_len=len(self.prompt),
            n_past=self.n_past,
            pending_prefill=self.pending_prefill,
            generated=self.generated,
            arrival_ns=self.arrival_ns,
            first_token_ns=self.first_token_ns,
            last_token_ns=self.last_token_ns,
            last_progress_ns=self.last_progress_ns,
            burst=self.burst,
            draft=self.draft,
            spec_accept_ewma=self.spec_accept_ewma,
        )

    def span(self, item: BatchItem) -> Span:
        """The tokens an item decodes: the pending token and its drafts, or a prompt chunk."""
        n = item.n_tokens
        if item.phase is Phase.DECODE:
            assert self.next_token is not None
            tokens = [self.next_token, *self.draft[: n - 1]]
            return Span(self.seq_id, self.n_past, tokens, True, all_logits=len(tokens) > 1)
        last = item.logits and self.n_past + n == len(self.prompt)
        return Span(self.seq_id, self.n_past, self.prompt[self.n_past : self.n_past + n], last)

    def draw(self, item: BatchItem, span: Span) -> Draw | None:
        """How the item's logits are sampled (None: it has none): a drafted decode's drafts
        are verified row by row."""
        if not span.logits:
            return None
        assert self.sampler is not None
        drafts = tuple(span.tokens[1:]) if item.phase is Phase.DECODE else ()
        return Draw(self.sampler, self.request.logprobs, drafts)

    def kv_tokens(self) -> list[int]:
        """The tokens whose KV this sequence holds, in position order."""
        n = self.n_past
        if n <= len(self.prompt):
            return self.prompt[:n]
        return self.prompt + self.out[: n - len(self.prompt)]

    def token_event(
        self, text: str, token_id: int, logprobs: p.Logprobs | None = None
    ) -> p.TokenEvent | None:
        """The event for newly released text (None when not streaming: kept for the end)."""
        if self.request.stream:
            return p.TokenEvent(id=self.request.id, text=text, token_id=token_id, logprobs=logprobs)
        self.parts.append(text)
        if logprobs is not None:
            self.logprobs.append(logprobs)
        return None

    def final_event(self, reason: str, now_ns: int, detail: str | None = None) -> p.Event:
        ms = 1e-6
        first, last = self.first_token_ns, self.last_token_ns
        timings = p.Timings(
            queue_ms=((self.admitted_ns or now_ns) - self.arrival_ns) * ms,
            ttft_ms=(first - self.arrival_ns) * ms if first else None,
            e2e_ms=(now_ns - self.arrival_ns) * ms,
            prompt_ms=(self.prefill_done_ns - self.admitted_ns) * ms
            if self.prefill_done_ns and self.admitted_ns
            else None,
            decode_tokens_per_s=(self.generated - 1) / ((last - first) * 1e-9)
            if first and last and last > first
            else None,
        )
        usage = p.Usage(len(self.prompt), self.generated, self.reused.tokens)
        rid = self.request.id
        if self.request.stream:
            return p.EosEvent(rid, reason, usage, timings, detail)  # type: ignore[arg-type]
        lps = self.logprobs if self.request.logprobs is not None else None
        text = "".join(self.parts)
        return p.CompletionEvent(rid, text, reason, usage, timings, detail, lps)  # type: ignore[arg-type]
