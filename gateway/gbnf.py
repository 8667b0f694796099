"""OpenAI's ``response_format`` and forced tool calls as GBNF grammars for the core.

JSON schemas are converted by llama-cpp-python's converter (llama_cpp/llama_grammar.py, pure
Python). That module is loaded from its file on its own: importing the ``llama_cpp`` package
would load libllama into the gateway, which only speaks the socket protocol.
"""

from __future__ import annotations

import importlib.util
import json
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from uma_serve.gateway.errors import ApiError, bad_request
from uma_serve.gateway.nesting import check_depth

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
# a schema's grammar grows with the square of its nesting (arrays 400 deep: 1.2 MB), and the
# converter recurses once per level: both are bounded (the depth by gateway/nesting.py), a 400
# naming the field
MAX_GRAMMAR_BYTES = 512 * 1024  # a converted grammar's size
MAX_PARALLEL_CALLS = 4  # calls one forced answer may hold (parallel_tool_calls)
# any JSON object; whitespace kept to one optional space so a model cannot run away in it
JSON_OBJECT = r"""root ::= object
value ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= " "?
"""


_CHAR = 'char ::= [^"\\\\] |'
_JSON_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'


@cache
def _converter_module() -> ModuleType:
    spec = importlib.util.find_spec("llama_cpp")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise ApiError(500, "llama_cpp's JSON-schema converter is not installed", "server_error")
    path = Path(next(iter(spec.submodule_search_locations))) / "llama_grammar.py"
    mod_spec = importlib.util.spec_from_file_location("_uma_llama_grammar", path)
    assert mod_spec is not None and mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


def _convert(schema: Any, root: str, param: str, conv: Any = None) -> Any:
    """A SchemaConverter (``conv``, else a new one) that has visited ``schema`` as rule
    ``root``."""
    if conv is None:
        mod = _converter_module()
        conv = mod.SchemaConverter(
            prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False
        )
    try:
        if not isinstance(schema, dict):
            raise ValueError("a JSON schema must be an object")
        conv.visit(conv.resolve_refs(schema, "request"), root)
    except Exception as exc:  # noqa: BLE001 (the converter raises bare Exceptions)
        raise bad_request(f"unsupported JSON schema: {exc}", param, "invalid_value") from None
    return conv


_DEFS = ("$defs", "definitions")


def _hoisted(schema: Any, prefix: str, defs: dict[str, Any]) -> Any:
    """``schema`` (a function's parameters) with its local definitions moved into ``defs``
    under ``prefix``-ed names and its ``$ref``s rewritten to them: several functions' own
    ``#/$defs/...`` then live in one document without clashing (the converter names a
    definition's rule by its name alone)."""

    def rewrite(node: Any) -> Any:
        if isinstance(node, list):
            return [rewrite(x) for x in node]
        if not isinstance(node, dict):
            return node
        out = {k: rewrite(v) for k, v in node.items() if k not in _DEFS or node is not schema}
        ref = node.get("$ref")
        if isinstance(ref, str):
            for key in _DEFS:
                if ref.startswith(f"#/{key}/"):
                    out["$ref"] = f"#/$defs/{prefix}{ref[len(key) + 3 :]}"
        return out

    if isinstance(schema, dict):
        for key in _DEFS:
            for name, sub in (schema.get(key) or {}).items():
                defs[f"{prefix}{name}"] = rewrite(sub)
    return rewrite(schema)


def _format(conv: Any, param: str) -> str:
    """The grammar's text; JSON strings may not hold raw control characters (the converter's
    ``char`` allows them, and JSON parsers refuse them). Over MAX_GRAMMAR_BYTES: a 400."""
    text = conv.format_grammar().replace(_CHAR, _JSON_CHAR)
    if (size := len(text.encode())) > MAX_GRAMMAR_BYTES:
        message = f"the JSON schema makes a grammar of {size} bytes, over the limit of "
        raise bad_request(f"{message}{MAX_GRAMMAR_BYTES}", param, "invalid_value")
    return text


def json_schema_grammar(schema: Any, param: str = "response_format") -> str:
    """GBNF whose language is the JSON documents ``schema`` accepts (as llama.cpp converts)."""
    check_depth(schema, param)  # the converter recurses once per level
    return _format(_convert(schema, "", param), param)


def call_schema(function: dict[str, Any]) -> dict[str, Any]:
    """One call's JSON: ``{"name": <the name>, "arguments": <its parameters' schema>}``."""
    params = function.get("parameters") or {"type": "object"}
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def call_prefix(functions: list[dict[str, Any]]) -> str:
    """What every forced answer starts with, known before it is generated: the call's
    opening tag and, with one function to call, its name up to the arguments' value. It is
    put in the prompt (the core's ``prefill``) instead of being sampled token by token, and
    the grammar (``tool_call_grammar`` with ``prefilled``) goes on from there."""
    head = f'{TOOL_OPEN}\n{{"name": "'
    if len(functions) == 1:
        return f'{head}{functions[0]["name"]}", "arguments":'
    return head


def tool_call_grammar(
    functions: list[dict[str, Any]],
    parallel: bool,
    optional: bool = False,
    prefilled: bool = False,
) -> str:
    """GBNF for a tool call (or up to MAX_PARALLEL_CALLS of them) in the documented format
    (docs/GATEWAY.md "Tool calls"), each to one of ``functions``. ``optional`` (tool_choice
    auto): the answer may instead be any text that does not start with the call's opening
    tag, so a call the model starts is always a valid one. ``prefilled`` (a forced call):
    the answer starts after ``call_prefix``, which the prompt ends with; when it holds one
    call, it ends with the arguments (the parser has the call then: gateway/tool_calls.py),
    so neither the fixed head nor the fixed close is sampled token by token."""
    defs: dict[str, Any] = {}
    params = []
    for i, f in enumerate(functions):
        check_depth(f.get("parameters"), f"tools[{i}].function.parameters")
        # each function's "#/$defs/..." refers to its own parameters, not to this wrapper
        params.append(_hoisted(f.get("parameters"), f"fn{i}-", defs))
    conv = None
    if parallel or not prefilled:
        schemas = [
            call_schema({**f, "parameters": p}) for f, p in zip(functions, params, strict=True)
        ]
        schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
        conv = _convert({**schema, "$defs": defs} if defs else schema, "call", "tools")
    block = f'"{TOOL_OPEN}\\n" call "\\n{TOOL_CLOSE}"'
    more = f' ("\\n" {block}){{0,{MAX_PARALLEL_CALLS - 1}}}' if parallel else ""
    if prefilled:
        conv, first = _rest_of_first_call(conv, functions, params, defs)
        if parallel:  # a single call ends with its arguments: its close is never read
            first += f' "}}" space "\\n{TOOL_CLOSE}"'
    else:
        first = block
    assert conv is not None
    calls = conv._add_rule("tool-calls", f"{first}{more}")
    if optional:
        text = conv._add_rule("free-text", _not_starting_with(TOOL_OPEN))
        conv._add_rule("root", f"{calls} | {text}")
    else:
        conv._add_rule("root", calls)
    return _format(conv, "tools")


def _rest_of_first_call(
    conv: Any, functions: list[dict[str, Any]], params: list[Any], defs: dict[str, Any]
) -> tuple[Any, str]:
    """The converter and a rule body for the first call after ``call_prefix``: (with several
    functions, the rest of one's name, then) its arguments."""
    options = []
    for i, (f, p) in enumerate(zip(functions, params, strict=True)):
        schema = p if p is not None else {"type": "object"}
        if defs and isinstance(schema, dict):
            schema = {**schema, "$defs": defs}
        conv = _convert(schema, f"arguments{i}", "tools", conv)
        name = "" if len(functions) == 1 else json.dumps(f'{f["name"]}", "arguments":') + " "
        options.append(f"{name}space arguments{i}")
    return conv, f"({' | '.join(options)})"


def _not_starting_with(marker: str) -> str:
    """A rule's body for any text, empty too, except one that starts with ``marker``: after
    each matched character of it, either the text ends, or the next one differs."""
    rest = "[^\\x00]*"
    body = ""
    for ch in reversed(marker):
        cls = "\\" + ch if ch in "\\]^-" else ch
        alternatives = ['""', f"[^{cls}\\x00] {rest}"]
        if body:
            alternatives.append(f"{json.dumps(ch)} ({body})")
        body = " | ".join(alternatives)
    return body


def tools_block(tools: list[dict[str, Any]]) -> str:
    """The fallback prompt's list of tools and the call format (docs/GATEWAY.md)."""
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "You may call functions. Their JSON schemas:\n"
        f"<tools>\n{listed}\n</tools>\n"
        "To call one, answer with one block per call and nothing else:\n"
        f'{TOOL_OPEN}\n{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}\n'
        f"{TOOL_CLOSE}"
    )
