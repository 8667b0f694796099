"""OpenAI request bodies as msgspec Structs: decoded and type-checked in one step.

Unknown fields are refused here (as OpenAI does with "Unrecognized request argument");
gateway/lenient.py retries without them unless --strict-fields. Fields OpenAI defines but
the core cannot honour (``best_of``, ``suffix``, prompt logprobs) are accepted only at their
neutral values and otherwise refused with a 400 that names the parameter. ``response_format``
and forced tool calls become a GBNF grammar (gateway/gbnf.py); tool history is rendered by
gateway/tool_prompt.py.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec

from uma_serve.gateway.errors import ApiError, bad_request
from uma_serve.gateway.nesting import check_depth, deep_param, too_deep
from uma_serve.gateway.tool_prompt import check_tools, tool_messages

Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=2.0)]
Prob = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]
Bias = Annotated[float, msgspec.Meta(ge=-100.0, le=100.0)]
MAX_N = 16  # choices per request (each is a sequence in the core)
QoS = Literal["interactive", "background"]
# OpenAI's processing tiers: "flex" is bulk work (background); the rest are served normally
ServiceTier = Literal["auto", "default", "flex", "priority", "scale"]
MAX_STOPS = 16  # stop strings per request (llama-server and vLLM take more than OpenAI's 4)
Stop = str | Annotated[list[str], msgspec.Meta(max_length=MAX_STOPS)]
TopK = Annotated[int, msgspec.Meta(ge=-1)]  # 0 or -1 (vLLM's "off"): no top-k truncation
RepeatPenalty = Annotated[float, msgspec.Meta(gt=0.0, le=10.0)]


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool = False


class _Sampling(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Fields common to both routes."""

    model: str | None = None
    temperature: Temperature | None = None
    top_p: Prob | None = None
    stop: Stop | None = None
    seed: int | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # token ids as JSON object keys (strings), as OpenAI
    logit_bias: Annotated[dict[str, Bias], msgspec.Meta(max_length=1024)] | None = None
    user: str | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=MAX_N)] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    # the scheduling class, docs/GATEWAY.md "Labels": OpenAI's service_tier, vLLM's priority
    # (lower is sooner; above 0 is background), UMA's qos (also the X-UMA-QoS header)
    service_tier: ServiceTier | None = None
    priority: int | None = None
    qos: QoS | None = None
    # Extension (as llama-server's): keep generating past EOS, for fixed-length benches.
    ignore_eos: bool | None = None
    # llama-server's and vLLM's sampling extras, applied by the core's sampler
    top_k: TopK | None = None
    min_p: Prob | None = None
    repeat_penalty: RepeatPenalty | None = None  # llama-server's name
    repetition_penalty: RepeatPenalty | None = None  # vLLM's name for the same

    @property
    def core_logprobs(self) -> int | None:
        """Generate.logprobs: alternatives per token, or None for no log-probabilities."""
        return None

    @property
    def token_bias(self) -> dict[int, float] | None:
        return {int(k): v for k, v in self.logit_bias.items()} if self.logit_bias else None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def check_common(self) -> None:
        for key in self.logit_bias or {}:
            if not key.isascii() or not key.isdigit():
                raise bad_request(
                    f"logit_bias keys must be token ids (non-negative integers), not {key!r}",
                    "logit_bias",
                    "invalid_value",
                )
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed with stream=true", "stream_options")


class CompletionRequest(_Sampling, kw_only=True):
    prompt: str | list[str | int]
    max_tokens: int | None = 16
    echo: bool | None = False
    best_of: int | None = None
    suffix: str | None = None
    logprobs: Annotated[int, msgspec.Meta(ge=0, le=5)] | None = None  # legacy: up to 5
    # llama-server's extension: GBNF text (root rule ``root``) constraining the output
    grammar: Annotated[str, msgspec.Meta(min_length=1, max_length=65536)] | None = None

    def check(self) -> None:
        self.check_common()
        if isinstance(self.prompt, list):
            if any(not isinstance(x, str) for x in self.prompt):
                raise bad_request("token-id prompts are not supported; send text", "prompt")
            if len(self.prompt) != 1:
                raise bad_request("exactly one prompt per request is supported", "prompt")
        if self.best_of is not None and self.best_of != 1:
            raise bad_request("only best_of=1 is supported", "best_of", "unsupported_value")
        if self.suffix:
            raise bad_request("suffix (insertion) is not supported", "suffix", "unsupported_value")
        if self.logprobs is not None and self.echo:
            msg = "logprobs with echo (log-probabilities of the prompt) are not supported"
            raise bad_request(msg, "logprobs", "unsupported_value")

    @property
    def core_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else str(self.prompt[0])


class TextPart(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    text: str | None = None


FunctionName = Annotated[str, msgspec.Meta(pattern=r"^[a-zA-Z0-9_.-]{1,64}$")]


class FunctionDef(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(msgspec.Struct, forbid_unknown_fields=True):
    name: str


class NamedToolChoice(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: str
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseFormat(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class CalledFunction(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    arguments: str


class ToolCallIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    def text(self, index: int) -> str:
        where = f"messages[{index}]"
        if self.role == "function":
            raise bad_request("function messages are not supported: use tool", f"{where}.role")
        if self.content is None and (self.tool_calls or self.role == "assistant"):
            return ""
        if self.content is None:
            raise bad_request("message content is required", f"{where}.content")
        if isinstance(self.content, str):
            return self.content
        texts = []
        for j, part in enumerate(self.content):
            if part.type != "text" or part.text is None:
                raise bad_request(
                    f"content part type {part.type!r} is not supported (text only)",
                    f"{where}.content[{j}]",
                )
            texts.append(part.text)
        return "\n".join(texts)


class ChatRequest(_Sampling, kw_only=True):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], msgspec.Meta(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # vLLM's and llama-server's: more variables for the chat template (enable_thinking...)
    chat_template_kwargs: dict[str, Any] | None = None

    def check(self) -> None:
        self.check_common()
        if not self.messages:
            raise bad_request("messages must not be empty", "messages")
        check_template_kwargs(self.chat_template_kwargs)
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
        for i, tool in enumerate(self.tools or []):
            check_depth(tool.function.parameters, f"tools[{i}].function.parameters")
        if self.response_format is not None and self.response_format.json_schema is not None:
            check_depth(
                self.response_format.json_schema.schema, "response_format.json_schema.schema"
            )
        check_tools(self)

    @property
    def core_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def requested_max_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    @property
    def tool_mode(self) -> Literal["auto", "forced"] | None:
        """How tool calls are read from the answer: none, parsed when present, or forced."""
        if not self.tools or self.tool_choice == "none":
            return None
        return "auto" if self.tool_choice in (None, "auto") else "forced"

    def forced_functions(self) -> list[FunctionDef]:
        """The functions a forced answer may call (all with ``required``, else the named)."""
        tools = [t.function for t in self.tools or []]
        if isinstance(self.tool_choice, NamedToolChoice):
            return [f for f in tools if f.name == self.tool_choice.function.name]
        return tools

    def core_messages(self) -> list[dict[str, str]]:
        """Messages in the core's shape: developer folds into system, parts into one text
        joined by newlines (with tools or tool turns, the fallback rendering of
        gateway/tool_prompt.py). The core merges system and consecutive same-role turns."""
        if self.tools or any(m.role == "tool" or m.tool_calls for m in self.messages):
            return tool_messages(self)
        out = []
        for i, m in enumerate(self.messages):
            role = "system" if m.role == "developer" else m.role
            out.append({"role": role, "content": m.text(i)})
        return out


def check_template_kwargs(kwargs: dict[str, Any] | None) -> None:
    """The core's checks of chat_template_kwargs, as 400s naming the field."""
    if kwargs is None:
        return
    check_depth(kwargs, "chat_template_kwargs")
    if "messages" in kwargs:
        msg = "chat_template_kwargs cannot replace the messages"
        raise bad_request(msg, "chat_template_kwargs.messages", "invalid_value")
    if _has_nul(kwargs):  # as the core refuses it (docs/PROTOCOL.md)
        msg = "chat_template_kwargs contains a NUL byte (\\u0000)"
        raise bad_request(msg, "chat_template_kwargs", "invalid_value")


def _has_nul(value: Any) -> bool:
    """Whether a string of ``value`` (keys too) holds a NUL; its depth is bounded already."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    return isinstance(value, list) and any(_has_nul(v) for v in value)


_AT = re.compile(r"at `\$\.?([^`]*)`")
_MISSING = re.compile(r"missing required field `([^`]+)`")
_UNKNOWN = re.compile(r"unknown field `([^`]+)`")
_decoders: dict[type, msgspec.json.Decoder] = {}


def _param_of(message: str) -> str | None:
    """The dotted field path msgspec names in its error, in OpenAI's ``param`` style."""
    path = m.group(1) if (m := _AT.search(message)) else ""
    leaf = None
    if m2 := _MISSING.search(message) or _UNKNOWN.search(message):
        leaf = m2.group(1)
    path = path.replace("[", ".[").replace(".[", "[").replace("[...]", "")  # a map's value
    if leaf:
        return f"{path}.{leaf}" if path else leaf
    return path or None


def not_json(exc: Exception) -> ApiError:
    """The 400 for a body msgspec cannot parse as JSON."""
    return ApiError(
        400,
        f"We could not parse the JSON body of your request ({exc}). "
        "The body must be a JSON object.",
        code="invalid_json",
    )


def decode(body: bytes, kind: type[msgspec.Struct]) -> Any:
    """Decode and validate a body into ``kind``, or raise a 400 ApiError naming the field."""
    if not body.strip():
        raise bad_request("the request body is empty; a JSON object is required")
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.json.Decoder(kind)
    try:
        req = decoder.decode(body)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        if _UNKNOWN.search(msg):
            msg = f"Unrecognized request argument supplied: {msg}"
        raise bad_request(msg, _param_of(msg)) from None
    except msgspec.DecodeError as exc:
        raise not_json(exc) from None
    except RecursionError:  # msgspec's, past about 1,000 levels (gateway/nesting.py)
        raise too_deep(deep_param(body)) from None
    except UnicodeDecodeError as exc:  # msgspec's, for a string with bytes that are not UTF-8
        at = body.find(exc.object) + exc.start
        raise ApiError(
            400,
            f"The request body is not valid UTF-8 (byte 0x{exc.object[exc.start]:02x} at "
            f"offset {at}). JSON text must be UTF-8.",
            code="invalid_request",
        ) from None
    req.check()
    return req


class TokenizeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """llama-server's /tokenize body (``model`` accepted as vLLM clients send it)."""

    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False
    model: str | None = None

    def check(self) -> None:
        pass


class DetokenizeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """llama-server's /detokenize body."""

    tokens: list[int]
    model: str | None = None

    def check(self) -> None:
        pass
