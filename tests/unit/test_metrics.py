"""The metrics snapshot: one declaration (protocol.MetricsSnapshot) for the snapshot, the
gateway's Prometheus families and docs/METRICS.md."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import msgspec

from uma_serve.core import protocol as p
from uma_serve.core.metrics import PLAIN, EngineMetrics, metrics_table


def test_the_snapshot_is_the_declared_struct() -> None:
    m = EngineMetrics()
    m.kv_cells_total = 100
    m.state().kv_cells_used, m.state().kv_cells_used = 15, 10  # two contexts' sequences
    m.observe_ttft("interactive", 12.0)
    m.requests_total["stop"] += 1
    m.observe_request(12, 3, 16)
    snap = m.snapshot(prompt_tokens_reused_total=7)
    typed = msgspec.convert(snap, p.MetricsSnapshot)  # every field, well typed
    assert set(snap) == set(p.MetricsSnapshot.__struct_fields__)
    assert typed.kv_cache_usage_ratio == 0.25 and typed.prompt_tokens_reused_total == 7
    assert typed.requests_total.stop == 1 and typed.histograms.ttft_ms.count == 1
    assert typed.histograms_by_qos.ttft_ms["interactive"].count == 1
    prompt = typed.token_histograms.prompt_tokens
    assert prompt.counts[prompt.bounds.index(20)] == 1 and prompt.sum == 12  # in tokens


def test_metrics_doc_table_is_generated_from_the_declaration() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "METRICS.md").read_text()
    assert metrics_table() in doc


def test_every_exported_field_names_its_family_and_help() -> None:
    for path, _, meta in p.metric_fields():
        extra = meta.extra or {}
        assert meta.description, path
        if extra:
            assert extra["prom"].startswith("uma_") and extra["prom_help"], path
            assert extra.get("vllm", "uma_").startswith("uma_"), path


def test_a_counter_or_gauge_starts_at_its_declared_default() -> None:
    """EngineMetrics sets none of the schema's plain fields by hand: a new counter or gauge is
    its declaration in core/metrics_schema.py and the line that updates it."""
    m, declared = EngineMetrics(), p.MetricsSnapshot()
    assert PLAIN and all(getattr(m, n) == getattr(declared, n) for n in PLAIN)
    init = ast.parse(inspect.getsource(EngineMetrics.__init__).strip())
    assigned = {
        t.attr
        for node in ast.walk(init)
        if isinstance(node, ast.Assign)
        for target in node.targets
        for t in ast.walk(target)
        if isinstance(t, ast.Attribute)
    }
    assert not assigned & set(PLAIN), sorted(assigned & set(PLAIN))
