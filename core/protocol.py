"""Wire protocol between clients and the core: framed JSON, msgspec Structs.

Frame: ``uint32 little-endian length | UTF-8 JSON object``. Every request is decoded and
validated in one step into a Struct; every event is a Struct encoded by one encoder.
Clients depend on this module only (plus msgspec).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Annotated, Any, Literal

import msgspec

# the metrics answer's schema, re-exported
from uma_serve.core.metrics_parts import (
    Histogram as Histogram,
    Histograms as Histograms,
    QosHistograms as QosHistograms,
    RequestsByReason as RequestsByReason,
    TickTokens as TickTokens,
    TokenHistograms as TokenHistograms,
    TunerState as TunerState,
    prom_kind as prom_kind,
)
from uma_serve.core.metrics_schema import (
    MetricsSnapshot as MetricsSnapshot,
    metric_fields as metric_fields,
)

DEFAULT_MAX_FRAME = 1 << 20
HEADER = struct.Struct("<I")

# Error codes (docs/PROTOCOL.md lists each with its meaning).
E_PROTO = "E_PROTO_001"  # invalid JSON, invalid UTF-8, schema violation, unknown type
E_FRAME = "E_PROTO_002"  # frame length over the maximum: the connection is closed
E_DUP_ID = "E_PROTO_003"  # an id that is already in flight on this connection
E_LIMIT = "E_LIMIT_001"  # prompt over --max-prompt-bytes or over the context
E_LIMIT_TOKENS = "E_LIMIT_002"  # max_tokens over --max-tokens
E_BUSY = "E_BUSY_001"  # more requests than --max-sessions: retry later
E_TEMPLATE = "E_TEMPLATE_001"  # the chat template refused the messages (its own message)
E_MODEL = "E_MODEL_001"  # model problem (e.g. no chat template for messages)
E_RUNTIME = "E_RUNTIME_001"  # llama_decode failed hard for this request
E_IO = "E_IO_001"  # the client does not read its stream: write buffer over the bound
E_SHUTDOWN = "E_SHUTDOWN_001"  # the daemon is shutting down and takes no new requests
E_IDLE = "E_IDLE_001"  # connection idle past --idle-timeout: closed

PositiveInt = Annotated[int, msgspec.Meta(gt=0)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0.0)]
Prob = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]
MAX_GROUP = 64  # sequences one generate request may ask for (its n)
RequestId = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
QoS = Literal["interactive", "background"]
# token id -> added to its logit before sampling (-100 bans a token, +100 forces it), as OpenAI
LogitBias = Annotated[
    dict[Annotated[int, msgspec.Meta(ge=0)], Annotated[float, msgspec.Meta(ge=-100.0, le=100.0)]],
    msgspec.Meta(max_length=1024),
]


class Message(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["system", "user", "assistant"]
    content: str


class Sampling(msgspec.Struct, kw_only=True):
    """A request's sampling parameters, their bounds and defaults: the one definition. The
    wire's ``Generate`` extends it and the sampler (core/sampling.py) reads it as it is."""

    # defaults as llama.cpp's server: truncation keeps small models coherent
    temperature: NonNegFloat = 0.8
    top_p: Prob = 0.95
    top_k: Annotated[int, msgspec.Meta(ge=0)] = 40
    min_p: Prob = 0.05
    seed: Annotated[int, msgspec.Meta(ge=0, le=0xFFFFFFFF)] | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repeat_penalty: Annotated[float, msgspec.Meta(gt=0.0, le=10.0)] = 1.0
    logit_bias: LogitBias | None = None


class Generate(
    Sampling, tag_field="type", tag="generate", forbid_unknown_fields=True, kw_only=True
):
    """A generation. Exactly one of ``prompt`` and ``messages``."""

    id: RequestId
    prompt: str | None = None
    messages: list[Message] | None = None
    max_tokens: PositiveInt = 256
    stop: str | list[str] | None = None
    # log-probabilities of each generated token and of the top ``logprobs`` alternatives
    logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    stream: bool = True
    ignore_eos: bool = False
    qos: QoS = "interactive"
    # GBNF text (root rule ``root``) constraining the output: llama.cpp's grammar sampler
    grammar: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    # n > 1: n sequences admitted together or not at all (core/group.py), ids "<id>-<i>"
    n: Annotated[int, msgspec.Meta(ge=1, le=MAX_GROUP)] = 1
    chat_template_kwargs: dict[str, Any] | None = None  # more variables for the chat template
    prefill: str | None = None  # the answer's given start: it ends the prompt, is not generated

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of 'prompt' and 'messages' is required")
        if self.messages is not None and not self.messages:
            raise ValueError("'messages' must not be empty")
        # a NUL would cut the text short in llama.cpp's C tokenizer: reject it, naming where
        if self.prompt is not None and "\x00" in self.prompt:
            raise ValueError("'prompt' contains a NUL byte (\\u0000)")
        for i, m in enumerate(self.messages or ()):
            if "\x00" in m.content:
                raise ValueError(f"'messages[{i}].content' contains a NUL byte (\\u0000)")

    @property
    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return [s for s in stops if s]


class Cancel(msgspec.Struct, tag_field="type", tag="cancel", forbid_unknown_fields=True):
    id: RequestId


class MetricsRequest(msgspec.Struct, tag_field="type", tag="metrics", forbid_unknown_fields=True):
    id: str | None = None


class HealthRequest(msgspec.Struct, tag_field="type", tag="health", forbid_unknown_fields=True):
    id: str | None = None


class InfoRequest(msgspec.Struct, tag_field="type", tag="info", forbid_unknown_fields=True):
    id: str | None = None


class TokenizeRequest(
    msgspec.Struct, tag_field="type", tag="tokenize", forbid_unknown_fields=True, kw_only=True
):
    """Text to token ids, as llama-server's /tokenize (nothing is generated)."""

    id: str | None = None
    content: str
    add_special: bool = False  # prepend BOS (as a prompt is tokenized)
    parse_special: bool = True  # control-token texts become those tokens
    with_pieces: bool = False  # each token's text too


class DetokenizeRequest(
    msgspec.Struct, tag_field="type", tag="detokenize", forbid_unknown_fields=True, kw_only=True
):
    """Token ids to text, as llama-server's /detokenize."""

    id: str | None = None
    tokens: list[int]


# every request, told apart by its "type" (a frame without one is a generate)
Request = (
    Generate
    | Cancel
    | MetricsRequest
    | HealthRequest
    | InfoRequest
    | TokenizeRequest
    | DetokenizeRequest
)
REQUEST_TYPES: dict[str, type] = {
    t.__struct_config__.tag: t
    for t in Request.__args__  # type: ignore[attr-defined]
}


# ---- events (core -> client) ----


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache


class Timings(msgspec.Struct):
    queue_ms: float
    ttft_ms: float | None
    e2e_ms: float
    prompt_ms: float | None
    decode_tokens_per_s: float | None


class TokenLogprob(msgspec.Struct, array_like=True):
    """A token, its log-probability under the model (log-softmax of the raw logits) and its
    bytes (a token may hold part of a UTF-8 character)."""

    token_id: int
    logprob: float
    piece: bytes


class Logprobs(msgspec.Struct, array_like=True):
    token: TokenLogprob  # the generated token
    top: list[TokenLogprob]  # the most likely tokens at that step, most likely first


class TokenEvent(msgspec.Struct, tag_field="event", tag="token", omit_defaults=True):
    id: str
    text: str
    token_id: int
    logprobs: Logprobs | None = None


class EosEvent(msgspec.Struct, tag_field="event", tag="eos"):
    id: str
    reason: Literal["stop", "length", "cancelled", "error"]
    usage: Usage
    timings: Timings
    detail: str | None = None


class CompletionEvent(msgspec.Struct, tag_field="event", tag="completion"):
    """The answer to ``stream: false``: the whole text in one frame."""

    id: str
    text: str
    reason: Literal["stop", "length", "cancelled", "error"]
    usage: Usage
    timings: Timings
    detail: str | None = None
    logprobs: list[Logprobs] | None = None  # one per generated token, when asked


class ErrorEvent(msgspec.Struct, tag_field="event", tag="error"):
    id: str | None
    code: str
    message: str


class MetricsEvent(msgspec.Struct, tag_field="event", tag="metrics"):
    id: str | None
    metrics: dict[str, Any]


class HealthEvent(msgspec.Struct, tag_field="event", tag="health"):
    id: str | None
    status: Literal["ok", "draining", "error"]
    active_sessions: int
    waiting_sessions: int


class InfoEvent(msgspec.Struct, tag_field="event", tag="info"):
    id: str | None
    model: str
    model_path: str
    n_ctx: int
    n_ctx_per_seq: int
    n_seq: int
    n_vocab: int
    chat_template: bool
    version: str
    max_tokens: int
    max_prompt_bytes: int
    # the GGUF carries its own chat template (instruction-tuned models do; a base model's
    # chat goes through a shipped generic template and its answers are not a chat's)
    gguf_chat_template: bool = False
    # the largest request frame the core reads (--max-frame-bytes); a larger one closes the
    # connection, so clients refuse such a request themselves (0: not announced)
    max_frame_bytes: int = 0


class TokensEvent(msgspec.Struct, tag_field="event", tag="tokens", omit_defaults=True):
    """The answer to ``tokenize``: ids, and with ``with_pieces`` each token's text (a string,
    or its bytes as a list of ints where they are not valid UTF-8 on their own)."""

    id: str | None
    tokens: list[int]
    pieces: list[str | list[int]] | None = None


class TextEvent(msgspec.Struct, tag_field="event", tag="text"):
    """The answer to ``detokenize``: the tokens' text (invalid UTF-8 replaced by U+FFFD)."""

    id: str | None
    content: str


Event = (
    TokenEvent
    | EosEvent
    | CompletionEvent
    | ErrorEvent
    | MetricsEvent
    | HealthEvent
    | InfoEvent
    | TokensEvent
    | TextEvent
)


class ProtocolError(Exception):
    """A frame or request that cannot be accepted; ``code`` is one of the E_* codes."""

    def __init__(self, code: str, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


class _Envelope(msgspec.Struct):
    """What any JSON object says of itself: read only to explain a refused frame."""

    type: Any = None
    id: Any = None


_request_decoder = msgspec.json.Decoder(Request)
_generate_decoder = msgspec.json.Decoder(Generate)
_envelope_decoder = msgspec.json.Decoder(_Envelope)
_event_decoder = msgspec.json.Decoder(Event)
_TOO_DEEP = "invalid JSON object: nested too deeply (arrays/objects over ~1000 levels)"
_encoder = msgspec.json.Encoder()


def decode_request(payload: bytes) -> Request:
    """Decode and validate one request frame's payload, or raise ProtocolError."""
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(E_PROTO, f"frame is not valid UTF-8: {exc.reason}") from None
    try:
        return _request_decoder.decode(payload)
    except msgspec.ValidationError as exc:
        return _refused(payload, exc)
    except msgspec.DecodeError as exc:
        raise ProtocolError(E_PROTO, f"invalid JSON object: {exc}") from None
    except RecursionError:  # msgspec's parser recurses per nesting level (~1000 at most)
        raise ProtocolError(E_PROTO, _TOO_DEEP) from None


def _refused(payload: bytes, problem: msgspec.ValidationError) -> Request:
    """A JSON value the request union refused: a generate without ``type`` (the protocol's
    default) is decoded as such; anything else is an error naming the type and request id."""
    try:
        env = _envelope_decoder.decode(payload)
    except msgspec.DecodeError as exc:  # not an object, or malformed after what was refused
        raise ProtocolError(E_PROTO, f"invalid JSON object: {exc}") from None
    except RecursionError:
        raise ProtocolError(E_PROTO, _TOO_DEEP) from None
    request_id = env.id if isinstance(env.id, str) else None
    kind = "generate" if env.type is None else env.type
    if not isinstance(kind, str) or kind not in REQUEST_TYPES:
        known = ", ".join(sorted(REQUEST_TYPES))
        raise ProtocolError(E_PROTO, f"unknown type {kind!r} (known: {known})", request_id)
    if env.type is None:
        try:
            return _generate_decoder.decode(payload)
        except msgspec.ValidationError as exc:
            problem = exc
    raise ProtocolError(E_PROTO, f"invalid {kind} request: {problem}", request_id)


def encode(msg: msgspec.Struct | dict[str, Any]) -> bytes:
    """Encode one message as a complete frame (header + JSON)."""
    body = _encoder.encode(msg)
    return HEADER.pack(len(body)) + body


def decode_event(payload: bytes) -> Event:
    return _event_decoder.decode(payload)


async def read_frame(reader: asyncio.StreamReader, max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    """Read one frame's payload. Raises IncompleteReadError at EOF, ProtocolError if too big.

    The length is checked before anything of that size is read or allocated.
    """
    header = await reader.readexactly(HEADER.size)
    (length,) = HEADER.unpack(header)
    if length > max_frame:
        raise ProtocolError(E_FRAME, f"frame of {length} bytes is over the maximum {max_frame}")
    return await reader.readexactly(length)


def socket_answers(path: str) -> bool:
    """True when a process accepts connections on the Unix socket ``path`` (a stale socket
    file, or none, is False)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()
