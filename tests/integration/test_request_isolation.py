"""One request never hurts another: inputs that crashed the core or closed a shared connection
(issue 35) are refused alone, with a 400 naming the field, and the core serves on."""

from __future__ import annotations

import asyncio
import itertools
import string
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from uma_serve.clients.client import E_TOO_BIG, AsyncUmaClient, CoreError
from uma_serve.core import protocol as p

from .gateway_helpers import API_KEYS, core_metrics, start_gateway, wait_idle
from .helpers import gen

pytestmark = pytest.mark.integration


def _names(n: int) -> list[str]:
    """``n`` distinct three-letter rule names (short, so a long chain fits one body)."""
    letters = string.ascii_letters
    return ["".join(t) for t in itertools.islice(itertools.product(letters, repeat=3), n)]


def _rule_chain(n: int) -> str:
    """``root ::= r0``, ``r0 ::= r1``, ...: llama.cpp recurses once per link."""
    names = _names(n + 1)
    links = "".join(f"{a} ::= {b}\n" for a, b in itertools.pairwise(names))
    return f'root ::= {names[0]}\n{links}{names[-1]} ::= "a"\n'


CRASHERS = {
    "groups-30000-deep": "root ::= " + "(" * 30000 + '"a"' + ")" * 30000,
    "rule-chain-70000": _rule_chain(70000),
}


@pytest.mark.parametrize("name", sorted(CRASHERS))
def test_a_grammar_too_deep_for_the_parser_is_400_and_the_core_serves_on(
    gateway, umad, model_id, name
) -> None:
    body = {"model": model_id, "prompt": "hi", "max_tokens": 1, "grammar": CRASHERS[name]}
    r = httpx.post(f"{gateway.base_url}/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "grammar" and "grammar" in err["message"], err
    assert umad.proc.poll() is None, umad.log()[-2000:]
    ok = gateway.client().completions.create(model=model_id, prompt="Hello", max_tokens=4)
    assert ok.choices[0].text
    assert "Traceback" not in umad.log() and "Traceback" not in gateway.log()


def _nested_arrays(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.fixture(scope="module")
def one_connection_gateway(umad):
    """Every request on one pooled core connection; bodies up to 4 MiB (over the core's
    1 MiB frame limit, so a request too big for the core reaches the gateway's check)."""
    gw = start_gateway(umad.socket, "--pool-size", "1", "--max-body-bytes", str(4 << 20))
    yield gw
    gw.stop()


def _big_requests(model_id: str) -> list[tuple[str, dict, str]]:
    """(route, body, the param its 400 names): each once ended every stream on its connection."""
    deep = _nested_arrays(400)  # a 1.2 MB grammar once converted
    tool = {"type": "function", "function": {"name": "f", "parameters": deep}}
    chat = {"model": model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    huge_grammar = 'root ::= "' + "a" * 1_200_000 + '"'
    return [
        ("completions", {"model": model_id, "prompt": "hi", "grammar": huge_grammar}, "grammar"),
        (
            "chat/completions",
            {
                **chat,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": deep},
                },
            },
            "response_format.json_schema.schema",
        ),
        (
            "chat/completions",
            {**chat, "tools": [tool], "tool_choice": "required"},
            "tools[0].function.parameters",
        ),
    ]


def test_a_request_too_big_for_the_core_never_ends_anothers_stream(
    one_connection_gateway, umad, model_id
) -> None:
    gw = one_connection_gateway
    stream = gw.client().completions.create(
        model=model_id,
        prompt="Tell me a story.",
        max_tokens=300,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = [next(stream)]  # running, on the gateway's only core connection
    for route, body, param in _big_requests(model_id):
        r = httpx.post(f"{gw.base_url}/{route}", json=body, timeout=60)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param, r.text
    assert core_metrics(umad.socket)["active_sessions"] >= 1  # the stream still ran meanwhile
    chunks += list(stream)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "length" and chunks[-1].usage.completion_tokens == 300
    assert "Traceback" not in gw.log() and "Traceback" not in umad.log()


def test_the_client_refuses_a_frame_over_the_cores_limit_for_that_request_alone(umad) -> None:
    big = gen("hi", grammar='root ::= "' + "a" * 1_200_000 + '"')

    async def run() -> None:
        client = await AsyncUmaClient.connect(umad.socket)
        try:
            assert client.max_frame_bytes == umad.client().info().max_frame_bytes > 0
            running = client.stream(gen("Tell me a story.", max_tokens=64, ignore_eos=True))
            first = await anext(running)
            with pytest.raises(CoreError) as refused:
                await client.complete(big)
            assert refused.value.code == E_TOO_BIG, refused.value
            rest = [ev async for ev in running]
            assert isinstance(first, p.TokenEvent) and isinstance(rest[-1], p.EosEvent)
            assert rest[-1].usage.completion_tokens == 64 and not client.closed
        finally:
            await client.close()

    asyncio.run(run())


def test_concurrent_n_requests_never_lock_each_other_out(gateway, umad, model_id) -> None:
    """The core admits a request's n sequences together or not at all: of four concurrent
    n=16 requests (the core's --max-sessions is 16) one at least is served in full; each
    other one is served or refused whole. Sent as 16 separate requests, each took part of
    the 16 places and all four got 429."""
    body = {"model": model_id, "prompt": "Count:", "max_tokens": 2, "n": 16}

    def post(_: int) -> httpx.Response:
        return httpx.post(f"{gateway.base_url}/completions", json=body, timeout=120)

    for _round in range(3):
        wait_idle(umad.socket)  # the session's core: nothing left running by other tests
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(post, range(4)))
        statuses = [r.status_code for r in answers]
        assert set(statuses) <= {200, 429} and 200 in statuses, [r.text for r in answers]
        assert all(len(r.json()["choices"]) == 16 for r in answers if r.status_code == 200)
    m = wait_idle(umad.socket)
    assert m["active_sessions"] == 0 and m["waiting_sessions"] == 0 and m["kv_cells_used"] == 0


def test_tokenize_and_detokenize_take_an_inflight_place_and_are_bounded(
    strict_gateway, model_id
) -> None:
    """/tokenize and /detokenize hold one of --max-inflight's places (the strict gateway has
    one) while the core works, and their sizes are bounded by the core's limits."""
    gw, headers = strict_gateway, {"Authorization": f"Bearer {API_KEYS[0]}"}
    base = gw.url

    def tok() -> httpx.Response:
        return httpx.post(f"{base}/tokenize", json={"content": "hi"}, headers=headers)

    def detok(tokens: list[int]) -> httpx.Response:
        return httpx.post(f"{base}/detokenize", json={"tokens": tokens}, headers=headers)

    stream = gw.client(API_KEYS[0]).completions.create(
        model=model_id, prompt="Tell me a story.", max_tokens=200, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    next(stream)  # the only place is held by this stream now
    busy = [tok(), detok([1, 2])]
    list(stream)
    assert [r.status_code for r in busy] == [429, 429], [r.text for r in busy]
    assert all(r.json()["error"]["code"] == "rate_limit_exceeded" for r in busy)
    assert tok().status_code == 200 and detok([1, 2]).status_code == 200
    over = httpx.post(f"{base}/tokenize", json={"content": "a" * 20001}, headers=headers)
    assert over.status_code == 400 and over.json()["error"]["param"] == "content", over.text
    long = detok([1] * 20001)
    assert long.status_code == 400 and long.json()["error"]["param"] == "tokens", long.text
