"""Two real umad processes serving different GGUFs (SmolLM2-135M-Instruct and the embedded
Gemma 3 270M) behind one real gateway: each request goes to a core serving the model it
names (X-UMA-Core says which answered), /v1/models lists each model under its names and
aliases, an unknown name is a 404 listing them, and a request naming none goes to the first
core's model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from .gateway_helpers import Gateway, start_gateway

CHAT = [{"role": "user", "content": "Hi."}]


def _info(daemon):
    with daemon.client() as c:
        return c.info()


@pytest.fixture(scope="module")
def names(umad, chat_core) -> dict[str, list[str]]:
    """Each core's socket -> the model's names, its alias first."""
    chat, base = _info(chat_core), _info(umad)
    return {
        chat_core.socket: ["chat", chat.model, Path(chat.model_path).stem],
        umad.socket: ["base", base.model, Path(base.model_path).stem],
    }


@pytest.fixture(scope="module")
def front(umad, chat_core, names) -> Iterator[Gateway]:
    chat_stem, base_name = names[chat_core.socket][2], names[umad.socket][1]
    gw = start_gateway(
        chat_core.socket, "--core-socket", umad.socket,
        "--served-model-name", f"chat={chat_stem}", "--served-model-name", f"base={base_name}",
    )  # fmt: skip
    yield gw
    gw.stop()


def _post(gw: Gateway, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{gw.base_url}{path}", json=body, timeout=120)


def test_models_lists_each_model_under_its_names(front, umad, chat_core, names) -> None:
    ids = [m.id for m in front.client().models.list().data]
    assert ids == names[chat_core.socket] + names[umad.socket]
    for name in ids:
        assert front.client().models.retrieve(name).id == name


@pytest.mark.parametrize("which", [0, 1, 2])
def test_each_name_goes_to_its_models_core(front, names, which) -> None:
    for socket, known in names.items():
        name = known[which]
        for path, body in (
            ("/completions", {"prompt": "Hi", "max_tokens": 2}),
            ("/chat/completions", {"messages": CHAT, "max_tokens": 2}),
            ("/chat/completions", {"messages": CHAT, "max_tokens": 2, "stream": True}),
        ):
            r = _post(front, path, {**body, "model": name})
            assert r.status_code == 200, r.text
            assert r.headers["x-uma-core"] == socket, (name, path)
            assert f'"model":{json.dumps(name)}' in r.text  # compact JSON, whole or chunks


def test_other_apis_route_by_model_too(front, umad) -> None:
    r = _post(front, "/messages", {"model": "base", "messages": CHAT, "max_tokens": 2})
    assert r.status_code == 200 and r.headers["x-uma-core"] == umad.socket
    r = _post(front, "/responses", {"model": "base", "input": "Hi", "max_output_tokens": 2})
    assert r.status_code == 200 and r.headers["x-uma-core"] == umad.socket


def test_no_model_is_the_first_cores(front, chat_core) -> None:
    r = _post(front, "/chat/completions", {"messages": CHAT, "max_tokens": 2})
    assert r.headers["x-uma-core"] == chat_core.socket
    assert r.json()["model"] == "chat"


def test_an_unknown_model_is_a_404_naming_every_model(front, names) -> None:
    """With several models any name is no longer accepted (no --strict-model-name here)."""
    with pytest.raises(openai.NotFoundError) as err:
        front.client().chat.completions.create(model="gpt-4o-mini", messages=CHAT, max_tokens=2)
    assert err.value.code == "model_not_found" and err.value.param == "model"
    for name in ("chat", "base"):
        assert f"'{name}'" in err.value.message
    r = httpx.get(f"{front.base_url}/models/gpt-4o-mini", timeout=30)
    assert r.status_code == 404


def test_tokenize_uses_the_named_models_vocabulary(front) -> None:
    """SmolLM2 has "<|im_start|>" as one control token; Gemma reads it as text."""

    def count(model: str) -> int:
        r = httpx.post(f"{front.url}/tokenize", json={"content": "<|im_start|>", "model": model})
        return len(r.json()["tokens"])

    assert count("chat") == 1
    assert count("base") > 1
