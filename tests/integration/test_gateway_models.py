"""Model names through the real gateway and core: the internal name, the file's stem,
--served-model-name aliases, any name with one model served, --strict-model-name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from .gateway_helpers import Gateway, start_gateway


@pytest.fixture(scope="module")
def aliased(umad) -> Iterator[Gateway]:
    gw = start_gateway(
        umad.socket,
        "--served-model-name", "local-chat",
        "--served-model-name", "gpt-4o-mini",
        "--strict-model-name",
    )  # fmt: skip
    yield gw
    gw.stop()


def _info(umad):
    with umad.client() as c:
        return c.info()


def _ask(client: openai.OpenAI, model: str) -> str:
    r = client.completions.create(model=model, prompt="Hi", max_tokens=2, temperature=0)
    return r.model


def test_stem_and_internal_name_listed_and_accepted(sdk, umad) -> None:
    info = _info(umad)
    stem = Path(info.model_path).stem
    ids = [m.id for m in sdk.models.list().data]
    assert ids == [info.model, stem]
    assert sdk.models.retrieve(stem).id == stem
    assert _ask(sdk, stem) == stem
    assert _ask(sdk, info.model) == info.model


def test_any_name_with_one_model(sdk, umad) -> None:
    """As llama-server: a client's hard-coded name works; an empty one is the model's id."""
    assert _ask(sdk, "gpt-4o-mini") == "gpt-4o-mini"
    assert _ask(sdk, "") == _info(umad).model
    chat = sdk.chat.completions.create(
        model="whatever", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert chat.model == "whatever"


def test_served_model_names_are_aliases(aliased, umad) -> None:
    info = _info(umad)
    client = aliased.client()
    ids = [m.id for m in client.models.list().data]
    assert ids == ["local-chat", "gpt-4o-mini", info.model, Path(info.model_path).stem]
    assert _ask(client, "gpt-4o-mini") == "gpt-4o-mini"
    assert _ask(client, info.model) == info.model
    r = client.chat.completions.create(messages=[{"role": "user", "content": "Hi"}],
                                       model="local-chat", max_tokens=2)  # fmt: skip
    assert r.model == "local-chat"


def test_strict_model_name_refuses_others(aliased) -> None:
    client = aliased.client()
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="gpt-17", prompt="hi", max_tokens=4)
    assert err.value.code == "model_not_found" and err.value.param == "model"
    assert "local-chat" in err.value.message
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model="gpt-17", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-17")
