"""Which model a name picks among the cores' models, and which cores then take the request
(pure logic; tests/integration/test_gateway_model_routing.py runs two real cores)."""

from __future__ import annotations

import pytest

from uma_serve.core import protocol as p
from uma_serve.gateway.errors import ApiError
from uma_serve.gateway.model_names import names
from uma_serve.gateway.model_routing import group, pick
from uma_serve.gateway.router import NOTE, RouteNote, Router


def info(model: str, path: str) -> p.InfoEvent:
    return p.InfoEvent(None, model, path, 4096, 1024, 4, 1000, True, "0", 512, 20000)


CHAT = info("Smol", "/m/smol-instruct.gguf")
BASE = info("Gemma", "/m/gemma-base.gguf")


def test_aliases_for_one_model_or_every_model() -> None:
    served = ["local", "chat=smol-instruct", "base=Gemma"]
    assert names(CHAT, served) == ["local", "chat", "Smol", "smol-instruct"]
    assert names(BASE, served) == ["local", "base", "Gemma", "gemma-base"]


def test_group_keeps_core_order_and_joins_cores_of_one_model() -> None:
    models = group([("a", CHAT), ("b", BASE), ("c", CHAT)], [])
    assert [(m.names[0], m.cores) for m in models] == [("Smol", ["a", "c"]), ("Gemma", ["b"])]


def test_one_model_takes_any_name_unless_strict() -> None:
    models = group([("a", CHAT), ("b", CHAT)], [])
    assert pick(models, "gpt-4o-mini", strict=False)[0] == "gpt-4o-mini"
    assert pick(models, None, strict=False)[0] == "Smol"
    with pytest.raises(ApiError) as err:
        pick(models, "gpt-4o-mini", strict=True)
    assert err.value.status == 404


def test_several_models_take_their_names_only() -> None:
    models = group([("a", CHAT), ("b", BASE)], ["chat=Smol"])
    assert pick(models, "gemma-base", strict=False)[1].cores == ["b"]
    assert pick(models, "chat", strict=False)[1].cores == ["a"]
    assert pick(models, "", strict=False) == ("chat", models[0])
    with pytest.raises(ApiError) as err:
        pick(models, "gpt-4o-mini", strict=False)
    assert err.value.status == 404 and err.value.code == "model_not_found"
    assert "'gemma-base'" in err.value.message and "'chat'" in err.value.message


def test_the_router_ranks_only_the_cores_of_the_named_model() -> None:
    router = Router(["/a", "/b", "/c"])
    token = NOTE.set(RouteNote(cores=frozenset({"/b", "/c"})))
    try:
        gen = p.Generate(id="r", prompt="hello")
        for _ in range(20):
            order, _ = router.order(gen)
            assert {c.name for c in order} == {"/b", "/c"}
        assert [c.name for c in router.eligible()] == ["/b", "/c"]
    finally:
        NOTE.reset(token)
    assert len(router.order(p.Generate(id="r", prompt="x"))[0]) == 3
