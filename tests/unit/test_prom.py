"""The Prometheus export without a model: the conversion from the core's snapshot, vLLM's
names and labels, promtool's lint of a real scrape, and the names the deploy kit and
docs/METRICS.md use."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from uma_serve.core import protocol as p
from uma_serve.core.metrics import EngineMetrics
from uma_serve.gateway.prom import CoreSnapshot, GatewayMetrics, histogram_family

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
MODEL = "gemma-3-270m"


def test_histogram_conversion_is_cumulative_in_seconds():
    fam = histogram_family(
        "uma_x_seconds", "x", {"bounds": [5, 10], "counts": [1, 2, 3], "sum": 1500.0, "count": 6}
    )
    samples = {(s.name, s.labels.get("le")): s.value for s in fam.samples}
    assert samples[("uma_x_seconds_bucket", "0.005")] == 1
    assert samples[("uma_x_seconds_bucket", "0.01")] == 3
    assert samples[("uma_x_seconds_bucket", "+Inf")] == 6
    assert samples[("uma_x_seconds_count", None)] == 6
    assert samples[("uma_x_seconds_sum", None)] == pytest.approx(1.5)


def busy_engine() -> EngineMetrics:
    """An EngineMetrics with something in every histogram, counter and gauge kind."""
    engine = EngineMetrics()
    engine.observe_ttft("interactive", 12.0)
    engine.observe_itl("background", 30.0)
    engine.e2e_ms.observe(400.0)
    engine.queue_ms.observe(3.0)
    engine.observe_request(7, 3, 16)
    engine.record_tick(25.0, 2, 5)
    engine.requests_total["stop"] += 1
    engine.state().kv_cells_used, engine.kv_cells_total = 5, 10
    engine.tick_budget_ms_last = 50.0
    return engine


def exported_text(engine: EngineMetrics, vllm_names: bool = False, cores: int = 1) -> str:
    """A scrape's text: the snapshot of ``engine`` for each of ``cores`` cores, plus HTTP."""
    metrics = GatewayMetrics(vllm_names)
    snap = engine.snapshot()
    metrics.core.set_snapshots([CoreSnapshot(f"/run/{i}.sock", MODEL, snap) for i in range(cores)])
    metrics.http_requests.labels("/v1/completions", "POST", "200").inc()
    metrics.http_latency.labels("/v1/completions", "POST").observe(0.1)
    metrics.added_latency.observe(0.001)
    return generate_latest(metrics.registry).decode()


def families(text: str) -> dict[str, list]:
    """Family name (a counter's with ``_total``) -> its samples."""
    out = {}
    for fam in text_string_to_metric_families(text):
        out[fam.name + ("_total" if fam.type == "counter" else "")] = fam.samples
    return out


def exported_sample_names() -> set[str]:
    """Every series name the gateway exports, from a real EngineMetrics snapshot."""
    text = exported_text(busy_engine())
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


REQUIRED = {
    "uma_time_to_first_token_seconds_bucket",
    "uma_inter_token_latency_seconds_bucket",
    "uma_e2e_request_latency_seconds_bucket",
    "uma_request_queue_time_seconds_bucket",
    "uma_num_requests_running",
    "uma_num_requests_waiting",
    "uma_decode_ewma_seconds",
    "uma_tick_tokens",
    "uma_kv_cache_usage_ratio",
    "uma_prompt_tokens_total",
    "uma_generation_tokens_total",
    "uma_request_success_total",
    "uma_http_requests_total",
    "uma_http_request_duration_seconds_bucket",
    "uma_core_up",
    # vLLM's names where ours differ (issue 26)
    "uma_kv_cache_usage_perc",
    "uma_time_per_output_token_seconds_bucket",
    "uma_request_prompt_tokens_bucket",
    "uma_request_generation_tokens_bucket",
}


def test_issue_metric_names_are_exported():
    assert exported_sample_names() >= REQUIRED


def test_vllm_aliases_carry_model_name_and_the_same_values():
    by_name = families(exported_text(busy_engine()))
    gateway_own = {"uma_core_up", "uma_gateway_routed_requests_total"}
    for name, samples in by_name.items():
        if name not in gateway_own and "http" not in name and "added_latency" not in name:
            assert all(s.labels["model_name"] == MODEL for s in samples), name
    usage = by_name["uma_kv_cache_usage_perc"]
    assert [(s.labels, s.value) for s in usage] == [({"model_name": MODEL}, 0.5)]
    tpot = by_name["uma_time_per_output_token_seconds"]
    itl = by_name["uma_inter_token_latency_seconds"]
    assert [(s.labels, s.value) for s in tpot] == [(s.labels, s.value) for s in itl]
    assert tpot[-1].name.endswith("_sum") and tpot[-1].value == pytest.approx(0.030)
    prompt = by_name["uma_request_prompt_tokens"]
    le = {s.labels["le"]: s.value for s in prompt if s.name.endswith("_bucket")}
    assert le["5.0"] == 0 and le["10.0"] == 1  # bounds in tokens, not scaled
    sums = {s.name: s.value for s in by_name["uma_request_generation_tokens"]}
    assert sums["uma_request_generation_tokens_sum"] == 3
    assert by_name["uma_tick_budget_seconds"][0].value == 0.05  # ms in the snapshot


def test_vllm_metric_names_export_vllms_families_again():
    plain = exported_text(busy_engine())
    assert "vllm:" not in plain
    both = families(exported_text(busy_engine(), vllm_names=True, cores=2))
    vllm = {name for name in both if name.startswith("vllm:")}
    assert len(vllm) == 17
    # the four vLLM's stock Grafana dashboard reads beside the others (issue 36)
    assert {
        "vllm:gpu_cache_usage_perc",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_max_num_generation_tokens",
    } <= vllm
    for name in vllm:
        ours = both[name.replace("vllm:", "uma_").replace("gpu_cache", "kv_cache")]
        theirs = both[name]
        assert [(s.labels, s.value) for s in ours] == [(s.labels, s.value) for s in theirs]
        assert all(s.name.startswith(name.removesuffix("_total")) for s in theirs)
    assert both["vllm:num_requests_running"][1].labels == {
        "core": "/run/1.sock",
        "model_name": MODEL,
    }


def test_cli_flag_turns_the_vllm_names_on():
    from uma_serve.gateway.main import parser, settings_from

    assert not settings_from(parser().parse_args([])).vllm_metric_names
    assert settings_from(parser().parse_args(["--vllm-metric-names"])).vllm_metric_names


def test_names_in_base_units_and_no_gauge_ending_in_total():
    """promtool's lint, kept by the declaration: a time is exported in seconds under a name
    ending in _seconds, and only a counter ends in _total."""
    for path, _, meta in p.metric_fields():
        extra = meta.extra or {}
        for name in filter(None, (extra.get("prom"), extra.get("vllm"))):
            assert "_ms" not in name, name
            if p.prom_kind(path, meta) != "counter":
                assert not name.endswith("_total"), name
            if "_ms" in path:
                assert extra["per_unit"] == 1000.0 and name.endswith("_seconds"), path


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
@pytest.mark.parametrize("cores", [1, 2])
def test_promtool_check_metrics_is_clean(cores):
    text = exported_text(busy_engine(), cores=cores)
    out = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert out.returncode == 0 and not (out.stdout + out.stderr).strip(), out.stdout + out.stderr


def metric_names_in(expr: str) -> set[str]:
    return set(re.findall(r"\buma_[a-z0-9_]+\b", expr))


def test_dashboard_and_alerts_use_only_exported_metrics():
    exported = exported_sample_names()
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    rules = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    used = set().union(*(metric_names_in(e) for e in exprs))
    assert used, "no uma_ metric found in the dashboard or the alerts"
    assert used <= exported, f"not exported: {sorted(used - exported)}"
    titles = " ".join(panel["title"].lower() for panel in dashboard["panels"])
    needed = ("first token", "inter-token", "tokens per second", "running", "tick",
              "prefix cache", "speculative", "qos", "tokens per request")  # fmt: skip
    for title in needed:
        assert title in titles


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_parses_every_dashboard_query(tmp_path):
    """Each panel's PromQL parses: promtool checks them as recording rules."""
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    rules = [
        {"record": f"uma:panel_{i}", "expr": e.replace("$__rate_interval", "1m")}
        for i, e in enumerate(exprs)
    ]
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    out = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_metrics_doc_lists_every_exported_family():
    """docs/METRICS.md's Prometheus tables name each family the gateway exports, and no other."""
    doc = (ROOT / "docs" / "METRICS.md").read_text()
    section = doc.split("## Prometheus", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = {n for row in rows for n in re.findall(r"`(uma_[a-z0-9_]+)`", row.split("|")[1])}
    exported = {n for n in families(exported_text(busy_engine(), cores=2)) if n.startswith("uma_")}
    assert documented == exported, (sorted(documented - exported), sorted(exported - documented))


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_checks_rules_and_config():
    for args in (["check", "rules", "alerts.yml"], ["check", "config", "prometheus.yml"]):
        out = subprocess.run(["promtool", *args], cwd=DEPLOY, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
