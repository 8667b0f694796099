"""Protocol codec: valid requests decode, every invalid one gets its documented error code."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import get_args

import pytest
from hypothesis import given, settings, strategies as st

from uma_serve.core import protocol as p


def test_generate_without_type_is_a_generation() -> None:
    req = p.decode_request(b'{"id": "a", "prompt": "hi", "max_tokens": 3}')
    assert isinstance(req, p.Generate)
    assert (req.id, req.prompt, req.max_tokens, req.stream) == ("a", "hi", 3, True)


def test_messages_and_stop_list() -> None:
    raw = {
        "type": "generate",
        "id": "b",
        "messages": [{"role": "user", "content": "hello"}],
        "stop": ["\n", ""],
    }
    req = p.decode_request(json.dumps(raw).encode())
    assert isinstance(req, p.Generate)
    assert req.messages == [p.Message("user", "hello")]
    assert req.stops == ["\n"]


@pytest.mark.parametrize(
    "kind, cls", [("cancel", p.Cancel), ("metrics", p.MetricsRequest), ("health", p.HealthRequest)]
)
def test_admin_requests(kind: str, cls: type) -> None:
    req = p.decode_request(json.dumps({"type": kind, "id": "x"}).encode())
    assert isinstance(req, cls)


@pytest.mark.parametrize(
    "payload, fragment",
    [
        (b"{not json", "invalid JSON"),
        (b"[1, 2]", "invalid JSON"),
        (b'{"id": "a"}', "exactly one of"),
        (b'{"id": "a", "prompt": "x", "messages": [{"role": "user", "content": "y"}]}', "exactly"),
        (b'{"id": "a", "prompt": 5}', "prompt"),
        (b'{"id": "a", "prompt": "x", "max_tokens": 0}', "max_tokens"),
        (b'{"id": "a", "prompt": "x", "max_tokens": -3}', "max_tokens"),
        (b'{"id": "a", "prompt": "x", "temperature": -1}', "temperature"),
        (b'{"id": "a", "prompt": "x", "top_p": 1.5}', "top_p"),
        (b'{"id": "a", "prompt": "x", "bogus": 1}', "bogus"),
        (b'{"id": "", "prompt": "x"}', "id"),
        (b'{"type": "launch", "id": "a"}', "unknown type"),
        (b'{"type": "cancel"}', "id"),
        (b'{"id": "a", "messages": []}', "empty"),
        (b'{"id": "a", "messages": [{"role": "robot", "content": "x"}]}', "role"),
        (b'{"id": "a", "prompt": "\xff\xfe"}', "UTF-8"),
        (b'{"id": "a", "prompt": "x", "chat_template_kwargs": "on"}', "chat_template_kwargs"),
    ],
)
def test_invalid_requests_get_e_proto(payload: bytes, fragment: str) -> None:
    with pytest.raises(p.ProtocolError) as info:
        p.decode_request(payload)
    assert info.value.code == p.E_PROTO
    assert fragment in info.value.message


def test_error_keeps_request_id_when_readable() -> None:
    with pytest.raises(p.ProtocolError) as info:
        p.decode_request(b'{"id": "keep-me", "prompt": "x", "max_tokens": 0}')
    assert info.value.request_id == "keep-me"


def test_event_roundtrip() -> None:
    usage = p.Usage(3, 4)
    timings = p.Timings(1.0, 2.0, 3.0, 0.5, 10.0)
    for event in (
        p.TokenEvent("a", "hé", 7),
        p.TokenEvent(
            "a", "x", 9, p.Logprobs(p.TokenLogprob(9, -0.5, b"x"), [p.TokenLogprob(9, -0.5, b"x")])
        ),
        p.EosEvent("a", "length", usage, timings),
        p.CompletionEvent("a", "text", "stop", usage, timings),
        p.ErrorEvent(None, p.E_PROTO, "bad"),
    ):
        frame = p.encode(event)
        (length,) = p.HEADER.unpack(frame[:4])
        assert length == len(frame) - 4
        assert p.decode_event(frame[4:]) == event
    token = json.loads(p.encode(p.TokenEvent("a", "x", 1))[4:])
    assert token == {"event": "token", "id": "a", "text": "x", "token_id": 1}


def _read(data: bytes, max_frame: int = 1024) -> bytes:
    async def go() -> bytes:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await p.read_frame(reader, max_frame)

    return asyncio.run(go())


def test_read_frame_rejects_oversized_length_before_reading() -> None:
    with pytest.raises(p.ProtocolError) as info:
        _read(p.HEADER.pack(0xFFFFFFFF))
    assert info.value.code == p.E_FRAME


def test_read_frame_truncated_is_incomplete() -> None:
    with pytest.raises(asyncio.IncompleteReadError):
        _read(p.HEADER.pack(10) + b"abc")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes_never_crash(data: bytes) -> None:
    """Any payload either decodes to a valid request or raises ProtocolError: nothing else."""
    try:
        req = p.decode_request(data)
    except p.ProtocolError as exc:
        assert exc.code == p.E_PROTO and exc.message
    else:
        assert isinstance(req, p.Request)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
fields = st.sampled_from(
    ["id", "type", "prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "stop",
     "seed", "stream", "qos", "min_p", "repeat_penalty"]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(fields, json_values, max_size=8))
def test_fuzz_random_json_objects(obj: dict) -> None:
    try:
        req = p.decode_request(json.dumps(obj).encode())
    except p.ProtocolError as exc:
        assert exc.code == p.E_PROTO
    else:  # anything accepted satisfies the documented constraints
        if isinstance(req, p.Generate):
            assert req.max_tokens > 0 and (req.prompt is None) != (req.messages is None)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64), st.integers(min_value=0, max_value=2000))
def test_fuzz_frames(body: bytes, declared: int) -> None:
    """Random length prefixes and bodies: a payload, a truncation, or an oversize error."""
    try:
        payload = _read(p.HEADER.pack(declared) + body, max_frame=1024)
    except asyncio.IncompleteReadError:
        assert declared > len(body)
    except p.ProtocolError as exc:
        assert exc.code == p.E_FRAME and declared > 1024
    else:
        assert payload == body[:declared]


# ---- docs/PROTOCOL.md against core/protocol.py ----

PROTOCOL_DOC = (Path(__file__).parents[2] / "docs" / "PROTOCOL.md").read_text()


def doc_section(title: str) -> str:
    start = PROTOCOL_DOC.index(f"\n## {title}")
    end = PROTOCOL_DOC.find("\n## ", start + 1)
    return PROTOCOL_DOC[start : end if end > 0 else None]


def first_cells(section: str) -> list[str]:
    """The first cell of each body row of the section's tables."""
    rows = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ")]
    return [cell for cell in rows if not set(cell) <= set("- ")][1:]


def test_protocol_doc_names_every_request_type_and_no_other() -> None:
    types = {cls.__struct_config__.tag for cls in get_args(p.Request)}
    assert len(types) == len(get_args(p.Request)) == len(p.REQUEST_TYPES)
    documented = set(re.findall(r'"type": "(\w+)"', PROTOCOL_DOC))
    assert documented == types


def test_protocol_doc_names_every_event_and_no_other() -> None:
    events = {cls.__struct_config__.tag for cls in get_args(p.Event)}
    assert set(re.findall(r'"event": "(\w+)"', PROTOCOL_DOC)) == events


def test_protocol_doc_lists_every_error_code_and_no_other() -> None:
    codes = {v for k, v in vars(p).items() if k.startswith("E_") and isinstance(v, str)}
    assert len(codes) >= 12
    table = [cell.strip("`") for cell in first_cells(doc_section("Error codes"))]
    assert sorted(table) == sorted(codes)  # one row each
    assert set(re.findall(r"\bE_[A-Z]+_\d{3}\b", PROTOCOL_DOC)) == codes


def test_protocol_doc_lists_every_generate_field_and_no_other() -> None:
    cells = first_cells(doc_section("Requests").split("Other requests")[0])
    documented = {name for cell in cells for name in re.findall(r"`(\w+)`", cell)}
    assert documented == set(p.Generate.__struct_fields__) - {"type"}


def test_protocol_doc_names_every_uma_cli_flag_and_no_other() -> None:
    from uma_serve.clients.cli import parser

    ap = parser()
    flags = {o for a in ap._actions for o in a.option_strings if o.startswith("--")} - {"--help"}
    assert set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", doc_section("uma-cli"))) == flags
