"""A real Prometheus server scrapes the real gateway while requests run, then is queried."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from .gateway_helpers import free_port, start_gateway, wait_idle

pytestmark = pytest.mark.integration
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PROMETHEUS = shutil.which("prometheus")


def query(base: str, expr: str) -> list[dict]:
    r = httpx.get(f"{base}/api/v1/query", params={"query": expr}, timeout=10)
    r.raise_for_status()
    return r.json()["data"]["result"]


def wait_for_value(base: str, expr: str, timeout: float = 60.0) -> float:
    """Poll an instant query until it returns a positive number; return it (or fail)."""
    deadline = time.monotonic() + timeout
    last: list[dict] = []
    while time.monotonic() < deadline:
        last = query(base, expr)
        if last and float(last[0]["value"][1]) > 0:
            return float(last[0]["value"][1])
        time.sleep(0.5)
    pytest.fail(f"{expr} had no positive value within {timeout}s: {last}")


@pytest.fixture
def prometheus(gateway, tmp_path):
    if PROMETHEUS is None:
        pytest.fail("Debian's prometheus is not installed (make install installs it)")
    port = free_port()
    target = gateway.url.removeprefix("http://")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: uma-gateway\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited: {(tmp_path / 'prometheus.log').read_text()}")
            try:
                if httpx.get(f"{base}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("prometheus did not become ready")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_prometheus_scrapes_gateway_while_requests_run(prometheus, gateway, model_id):
    client = gateway.client()
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            stream = client.completions.create(
                model=model_id, prompt="Tell me about the sea.", max_tokens=8, stream=True
            )
            for _ in stream:
                pass

    worker = threading.Thread(target=load)
    worker.start()
    try:
        wait_for_value(prometheus, 'up{job="uma-gateway"}')
        wait_for_value(prometheus, "uma_core_up")
        assert wait_for_value(prometheus, "sum(uma_time_to_first_token_seconds_count)") >= 1
        wait_for_value(prometheus, "sum(uma_time_to_first_token_seconds_bucket)")
        assert wait_for_value(prometheus, "sum(uma_generation_tokens_total)") >= 1
        wait_for_value(prometheus, "sum(uma_prompt_tokens_total)")
        wait_for_value(prometheus, "sum(rate(uma_generation_tokens_total[15s]))")
        ttft = "rate(uma_time_to_first_token_seconds_bucket[15s])"
        wait_for_value(prometheus, f"histogram_quantile(0.95, sum by (le) ({ttft}))")
        wait_for_value(
            prometheus, 'sum(uma_http_requests_total{route="/v1/completions",status="200"})'
        )
        assert wait_for_value(prometheus, "uma_gateway_added_latency_seconds_count") >= 1
        added = wait_for_value(prometheus, "uma_gateway_added_latency_seconds_sum")
        assert 0 < added < 60  # seconds, summed: a share of each request, not the request
    finally:
        stop.set()
        worker.join(60)


def test_deploy_queries_only_use_metrics_the_gateway_exports(gateway, sdk, model_id):
    """Every metric in the dashboard and alerts is a series the running gateway serves."""
    sdk.completions.create(model=model_id, prompt="Hi", max_tokens=2)
    text = httpx.get(f"{gateway.url}/metrics").text
    exported = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    rules = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
    exprs += [r["expr"] for group in rules["groups"] for r in group["rules"]]
    used = {m for e in exprs for m in re.findall(r"\buma_[a-z0-9_]+\b", e)}
    assert used and used <= exported, sorted(used - exported)


def scrape(url: str) -> dict[str, list]:
    """The gateway's /metrics now: family name -> its samples."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {fam.name: fam.samples for fam in text_string_to_metric_families(text)}


def one(samples: list, name: str) -> float:
    return next(s.value for s in samples if s.name == name)


def test_vllm_names_and_model_name_after_a_real_request(umad, gateway, sdk, model_id):
    """After a real request the real gateway's scrape has vLLM's names (kv_cache_usage_perc,
    time_per_output_token_seconds, the per-request token histograms), every core series
    names the model, and promtool finds nothing to flag in it."""
    wait_idle(umad.socket)
    before = scrape(gateway.url)["uma_request_prompt_tokens"]
    answer = sdk.completions.create(model=model_id, prompt="Name three colors.", max_tokens=4)
    wait_idle(umad.socket)
    text = httpx.get(f"{gateway.url}/metrics", timeout=30).text
    after = {fam.name: fam.samples for fam in text_string_to_metric_families(text)}
    prompt, generated = after["uma_request_prompt_tokens"], after["uma_request_generation_tokens"]
    count, total = "uma_request_prompt_tokens_count", "uma_request_prompt_tokens_sum"
    assert one(prompt, count) - one(before, count) == 1
    assert one(prompt, total) - one(before, total) == answer.usage.prompt_tokens
    assert one(generated, "uma_request_generation_tokens_sum") >= answer.usage.completion_tokens
    assert 0 <= after["uma_kv_cache_usage_perc"][0].value <= 1  # a share, as vLLM's
    tpot, itl = after["uma_time_per_output_token_seconds"], after["uma_inter_token_latency_seconds"]
    assert [s.value for s in tpot] == [s.value for s in itl]
    assert one(tpot, "uma_time_per_output_token_seconds_count") >= 1
    for name, samples in after.items():
        if name.startswith("uma_") and name not in GATEWAY_OWN:
            assert {s.labels.get("model_name") for s in samples} == {model_id}, name
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                          text=True)  # fmt: skip
    assert lint.returncode == 0 and not (lint.stdout + lint.stderr).strip(), lint.stdout


def test_vllm_metric_names_on_a_real_gateway(umad, model_id):
    """--vllm-metric-names: vLLM's families once more under vllm:*, same labels and values."""
    gw = start_gateway(umad.socket, "--vllm-metric-names")
    try:
        both = scrape(gw.url)
    finally:
        gw.stop()
    ours, theirs = both["uma_request_prompt_tokens"], both["vllm:request_prompt_tokens"]
    assert [(s.labels, s.value) for s in ours] == [(s.labels, s.value) for s in theirs]
    assert both["vllm:num_requests_running"][0].labels == {"model_name": model_id}


# the gateway's own families: no model_name (uma_core_up: a core that is down names none)
GATEWAY_OWN = {
    "uma_core_up",
    "uma_http_requests",
    "uma_http_request_duration_seconds",
    "uma_gateway_added_latency_seconds",
    "uma_gateway_routed_requests",
    "uma_http_inflight_requests",
}


def test_promtool_check_rules():
    assert shutil.which("promtool"), "promtool missing (make install installs prometheus)"
    out = subprocess.run(
        ["promtool", "check", "rules", str(DEPLOY / "alerts.yml")], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
