"""A bug in the gateway: the client gets a 500 error object with the request id and no
exception text; the log ties that id to the failure."""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.testclient import TestClient

from uma_serve.gateway.app import Settings, create_app


def test_an_unhandled_error_is_a_500_without_its_text(tmp_path, caplog):
    app = create_app(Settings(core_sockets=[str(tmp_path / "none.sock")]))

    async def broken(request: Request) -> None:
        if "named" in request.url.path:
            request.state.request_id = "cmpl-abc"
        raise KeyError("/secret/path and private text")

    app.add_route("/broken", broken, methods=["GET"])
    app.add_route("/broken-named", broken, methods=["GET"])
    with (
        caplog.at_level(logging.ERROR, "uma.gateway"),
        TestClient(app, raise_server_exceptions=False) as client,
    ):
        r = client.get("/broken-named")
        given = client.get("/broken", headers={"X-Request-Id": "mine-1"})
    assert r.status_code == 500 and r.headers["x-request-id"] == "cmpl-abc"
    err = r.json()["error"]
    assert err["code"] == "internal_error" and err["type"] == "server_error"
    assert "cmpl-abc" in err["message"]
    assert "secret" not in r.text and "KeyError" not in r.text
    assert "cmpl-abc" in caplog.text and "KeyError" in caplog.text
    assert given.status_code == 500 and given.headers["x-request-id"] == "mine-1"
    assert "mine-1" in given.json()["error"]["message"] and "mine-1" in caplog.text
