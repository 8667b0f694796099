"""Smaller llama.cpp/vLLM habits through the real gateway and core: seed -1 is random, up
to 16 stop strings, and vLLM's metric names for its stock Grafana panels."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from uma_serve.gateway import openai_schema as schema, routes

from .gateway_helpers import start_gateway

PROMPT = "Once upon a time, in a small village by the sea,"


def _text(gateway, **fields) -> str:
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 1.5, **fields}
    r = httpx.post(f"{gateway.base_url}/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_seed_minus_one_is_random(gateway) -> None:
    """As llama.cpp and vLLM: -1 draws a new seed per request; another seed is kept."""
    seeds = {
        routes.sampling(schema.decode(b'{"prompt": "a", "seed": -1}', schema.CompletionRequest))[
            "seed"
        ]
        for _ in range(8)
    }
    assert len(seeds) > 1 and all(0 <= s < 1 << 32 for s in seeds)
    kept = schema.decode(b'{"prompt": "a", "seed": 5}', schema.CompletionRequest)
    assert routes.sampling(kept)["seed"] == 5
    assert len({_text(gateway, seed=-1) for _ in range(3)}) > 1


def test_sixteen_stop_strings_and_the_last_one_counts(gateway) -> None:
    greedy = _text(gateway, temperature=0)
    word = greedy.split()[2]
    stops = [f"never-{i}" for i in range(15)] + [word]
    cut = _text(gateway, temperature=0, stop=stops)
    assert word not in cut and greedy.startswith(cut)
    r = httpx.post(
        f"{gateway.base_url}/completions",
        json={"prompt": PROMPT, "stop": [*stops, "one more"]},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop"


def _scrape(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.startswith("vllm:")
    }


def test_vllm_names_for_the_stock_grafana_panels(umad) -> None:
    gw = start_gateway(umad.socket, "--vllm-metric-names")
    try:
        before = _scrape(gw.url)
        body = {"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "ignore_eos": True}
        assert httpx.post(f"{gw.base_url}/completions", json=body, timeout=120).status_code == 200
        after = _scrape(gw.url)
    finally:
        gw.stop()
    assert 0 <= after["vllm:gpu_cache_usage_perc"] <= 1
    for name in ("request_prefill_time_seconds", "request_decode_time_seconds"):
        count = f"vllm:{name}_count"
        assert after[count] - before.get(count, 0) == 1
        assert after[f"vllm:{name}_sum"] > before.get(f"vllm:{name}_sum", 0)
    sums = "vllm:request_max_num_generation_tokens_sum"
    assert after[sums] - before.get(sums, 0) == 5
