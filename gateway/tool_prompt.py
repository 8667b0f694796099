"""A chat request's tools and formats for the core: checks, the grammar, and the fallback
prompt rendering of tools and tool turns (docs/GATEWAY.md "Tool calls").

The core's chat template takes plain (role, text) turns, so tool definitions, calls and
results are rendered here as text: a system block listing the tools as JSON and the call
format; an assistant's calls as ``<tool_call>`` blocks; a tool result as a user turn holding
a ``<tool_response>`` block (the core merges consecutive same-role turns: templates such as
Gemma's need the roles to alternate).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import msgspec

from uma_serve.gateway import gbnf
from uma_serve.gateway.errors import bad_request

RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"

if TYPE_CHECKING:
    from uma_serve.gateway.openai_schema import ChatMessage, ChatRequest


def check_tools(req: ChatRequest) -> None:
    """The 400s OpenAI gives for inconsistent tool and format fields."""
    choice = req.tool_choice
    if choice is not None and not req.tools:
        raise bad_request("tool_choice is only allowed when tools are specified", "tool_choice")
    names = {t.function.name for t in req.tools or []}
    if len(names) < len(req.tools or []):
        raise bad_request("tool function names must be unique", "tools")
    if choice is not None and not isinstance(choice, str) and choice.function.name not in names:
        raise bad_request(f"tool_choice names an unknown function {choice.function.name!r}",
                          "tool_choice")  # fmt: skip
    fmt = req.response_format
    if (
        fmt is not None
        and fmt.type == "json_schema"
        and (fmt.json_schema is None or fmt.json_schema.schema is None)
    ):
        raise bad_request("json_schema.schema is required", "response_format.json_schema")
    if fmt is not None and fmt.type != "text" and req.tool_mode == "forced":
        raise bad_request("response_format cannot be combined with a forced tool_choice",
                          "response_format")  # fmt: skip
    for i, m in enumerate(req.messages):
        if m.role == "tool" and not m.tool_call_id:
            raise bad_request("a tool message needs tool_call_id", f"messages[{i}].tool_call_id")


def grammar_of(req: ChatRequest) -> str | None:
    """The GBNF constraining the answer: tool calls (forced, or with ``auto`` either a valid
    call or text that starts as none) or the response format."""
    if req.tool_mode == "forced":
        functions = [_builtin(f) for f in req.forced_functions()]
        # a named function is called once (as OpenAI and vLLM do); "required" may call several
        parallel = req.parallel_tool_calls is not False and isinstance(req.tool_choice, str)
        return gbnf.tool_call_grammar(functions, parallel, prefilled=True)
    fmt = req.response_format
    if req.tool_mode == "auto" and (fmt is None or fmt.type == "text"):
        functions = [_builtin(t.function) for t in req.tools or []]
        parallel = req.parallel_tool_calls is not False
        return gbnf.tool_call_grammar(functions, parallel, optional=True)
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return gbnf.JSON_OBJECT
    assert fmt.json_schema is not None
    return gbnf.json_schema_grammar(fmt.json_schema.schema, "response_format.json_schema.schema")


def prefill_of(req: ChatRequest) -> str:
    """The forced answer's known start (gbnf.call_prefix), which the prompt ends with and the
    answer is read from; "" unless the calls are forced."""
    if req.tool_mode != "forced":
        return ""
    return gbnf.call_prefix([{"name": f.name} for f in req.forced_functions()])


def grammar_param_of(req: ChatRequest) -> str:
    """The field grammar_of builds the grammar from, to name it in an error."""
    fmt = req.response_format
    if req.tool_mode == "forced" or (
        req.tool_mode == "auto" and (fmt is None or fmt.type == "text")
    ):
        return "tools"
    return "response_format"


def _builtin(obj: msgspec.Struct) -> dict[str, Any]:
    """A Struct as plain JSON data, unset (None) fields left out, at any depth."""
    data = msgspec.to_builtins(obj)

    def strip(v: Any) -> Any:
        return {k: strip(x) for k, x in v.items() if x is not None} if isinstance(v, dict) else v

    return strip(data)


def _call_block(name: str, arguments: str) -> str:
    try:
        args: Any = json.loads(arguments)
    except ValueError:
        args = arguments
    call = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
    return f"{gbnf.TOOL_OPEN}\n{call}\n{gbnf.TOOL_CLOSE}"


def _turn(m: ChatMessage, index: int, names: dict[str, str]) -> tuple[str, str]:
    text = m.text(index)
    if m.role == "tool":
        result = {"tool_call_id": m.tool_call_id, "name": names.get(m.tool_call_id or ""),
                  "content": text}  # fmt: skip
        return (
            "user",
            f"{RESPONSE_OPEN}\n{json.dumps(result, ensure_ascii=False)}\n{RESPONSE_CLOSE}",
        )
    if m.tool_calls:
        blocks = [_call_block(c.function.name, c.function.arguments) for c in m.tool_calls]
        return "assistant", "\n".join([text, *blocks] if text else blocks)
    return ("system" if m.role == "developer" else m.role), text


def tool_messages(req: ChatRequest) -> list[dict[str, str]]:
    """The request's messages in the core's shape, tools and tool turns rendered as text
    (the core then merges the system turns and consecutive same-role turns)."""
    names = {c.id: c.function.name for m in req.messages for c in m.tool_calls or []}
    out = []
    for i, m in enumerate(req.messages):
        role, content = _turn(m, i, names)
        out.append({"role": role, "content": content})
    if req.tools and req.tool_choice != "none":
        block = gbnf.tools_block([_builtin(t) for t in req.tools])
        out.insert(0, {"role": "system", "content": block})
    return out
