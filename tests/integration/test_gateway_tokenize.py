"""/tokenize and /detokenize in llama-server's shapes, through the real gateway and daemon."""

from __future__ import annotations

import httpx


def test_tokenize_and_detokenize_round_trip(gateway, sdk, model_id) -> None:
    text = "Hello, world! <end_of_turn> é"
    r = httpx.post(f"{gateway.url}/tokenize", json={"content": text})
    assert r.status_code == 200 and "x-request-id" in r.headers, r.text
    tokens = r.json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    back = httpx.post(f"{gateway.url}/detokenize", json={"tokens": tokens})
    assert back.status_code == 200 and back.json() == {"content": text}
    # the same count the completions route reports for the prompt (which adds BOS)
    with_bos = httpx.post(f"{gateway.url}/tokenize", json={"content": text, "add_special": True})
    assert len(with_bos.json()["tokens"]) == len(tokens) + 1
    done = sdk.completions.create(model=model_id, prompt=text, max_tokens=1)
    assert done.usage.prompt_tokens == len(tokens) + 1


def test_parse_special_and_pieces(gateway) -> None:
    text = "<end_of_turn>"
    special = httpx.post(f"{gateway.url}/tokenize", json={"content": text}).json()["tokens"]
    plain = httpx.post(
        f"{gateway.url}/tokenize", json={"content": text, "parse_special": False}
    ).json()["tokens"]
    assert len(special) == 1 and len(plain) > 1
    pieces = httpx.post(
        f"{gateway.url}/tokenize", json={"content": "ab é", "with_pieces": True}
    ).json()["tokens"]
    assert all(set(t) == {"id", "piece"} for t in pieces)
    assert "".join(t["piece"] for t in pieces if isinstance(t["piece"], str)) == "ab é"


def test_errors_name_the_field(gateway) -> None:
    r = httpx.post(f"{gateway.url}/detokenize", json={"tokens": [10**9]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens", r.text
    r = httpx.post(f"{gateway.url}/tokenize", json={"text": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] in ("content", "text"), r.text
    # one model served: any model name is taken for it (--strict-model-name refuses it)
    r = httpx.post(f"{gateway.url}/tokenize", json={"content": "x", "model": "nope"})
    assert r.status_code == 200, r.text


def test_they_need_a_key_when_auth_is_on(strict_gateway) -> None:
    r = httpx.post(f"{strict_gateway.url}/tokenize", json={"content": "x"})
    assert r.status_code == 401
    key = {"Authorization": "Bearer test-key-one"}
    r = httpx.post(f"{strict_gateway.url}/tokenize", json={"content": "x"}, headers=key)
    assert r.status_code == 200
