"""The gateway when a client leaves mid-request or the core restarts: nothing leaks, nothing
hangs (the real gateway under uvicorn in front of the real umad)."""

from __future__ import annotations

import signal
import time

import httpx
import openai
import pytest
from conftest import start_daemon
from prometheus_client.parser import text_string_to_metric_families

from .gateway_helpers import core_metrics, start_gateway, wait_idle

pytestmark = pytest.mark.integration


def read_then_leave(gateway, model_id: str, chunks: int, **extra) -> None:
    """Open a long completion stream, read ``chunks`` chunks, then disconnect."""
    body = {"model": model_id, "prompt": "Once upon a time", "max_tokens": 400, "stream": True}
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", f"{gateway.base_url}/completions", json=body | extra) as r,
    ):
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: {")
            if seen == chunks:
                break


def test_client_disconnect_mid_stream_frees_the_sequence(gateway, umad, model_id):
    before = core_metrics(umad.socket)["requests_total"]["cancelled"]
    read_then_leave(gateway, model_id, 2)
    m = wait_idle(umad.socket)
    assert m["active_sessions"] == 0 and m["waiting_sessions"] == 0
    assert m["requests_total"]["cancelled"] == before + 1
    # ... and the gateway's Prometheus view says the same.
    prom, model = prom_samples(gateway), ("model_name", model_id)  # on every core series
    assert prom[("uma_num_requests_running", (model,))] == 0
    cancelled = prom[("uma_request_success_total", (("finished_reason", "cancelled"), model))]
    assert cancelled == before + 1
    assert prom[("uma_http_inflight_requests", ())] == 0


def test_client_disconnect_mid_stream_frees_every_choice(gateway, umad, model_id):
    before = core_metrics(umad.socket)["requests_total"]["cancelled"]
    read_then_leave(gateway, model_id, 4, n=3)
    m = wait_idle(umad.socket)
    assert m["active_sessions"] == 0 and m["waiting_sessions"] == 0
    deadline = time.monotonic() + 10
    while m["requests_total"]["cancelled"] < before + 3 and time.monotonic() < deadline:
        time.sleep(0.1)
        m = core_metrics(umad.socket)
    assert m["requests_total"]["cancelled"] == before + 3
    assert prom_samples(gateway)[("uma_http_inflight_requests", ())] == 0


def prom_samples(gateway) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{gateway.url}/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_client_disconnect_whole_request_cancels(gateway, umad, model_id):
    before = core_metrics(umad.socket)["requests_total"]["cancelled"]
    body = {"model": model_id, "prompt": "Once upon a time", "max_tokens": 400}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{gateway.base_url}/completions", json=body, timeout=1.0)
    m = wait_idle(umad.socket)
    assert m["active_sessions"] == 0
    deadline = time.monotonic() + 10
    while m["requests_total"]["cancelled"] < before + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
        m = core_metrics(umad.socket)
    assert m["requests_total"]["cancelled"] == before + 1


def test_gateway_survives_core_restart(fresh_tmp):
    daemon = start_daemon(fresh_tmp, "--n-seq", "2", "--n-ctx", "1024")
    gw = start_gateway(daemon.socket, log_dir=fresh_tmp)
    try:
        client = gw.client()
        model = client.models.list().data[0].id
        assert client.completions.create(model=model, prompt="Hi", max_tokens=2).choices
        stream = client.completions.create(
            model=model, prompt="Once upon a time", max_tokens=300, stream=True
        )
        chunks = iter(stream)
        assert next(chunks).choices
        daemon.stop(signal.SIGKILL)  # the core is lost (a crash; SIGTERM would drain the stream)
        with pytest.raises(openai.APIError):  # the stream reports the loss, it does not hang
            for _ in chunks:
                pass
        with pytest.raises(openai.InternalServerError) as err:
            client.completions.create(model=model, prompt="Hi", max_tokens=2)
        assert err.value.status_code == 503
        assert httpx.get(f"{gw.url}/health").status_code == 503
        daemon = start_daemon(fresh_tmp, "--n-seq", "2", "--n-ctx", "1024")
        assert client.completions.create(model=model, prompt="Hi", max_tokens=2).choices
        assert httpx.get(f"{gw.url}/health").status_code == 200
    finally:
        gw.stop()
        daemon.stop()
