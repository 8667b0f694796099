"""The metrics snapshot's schema, declared once: core/metrics.py fills it, gateway/prom.py
derives its Prometheus families from it and docs/METRICS.md's table is generated from it (a
test checks). protocol.py re-exports it: clients and the gateway import only the protocol.
Its parts (the nested structs, ``_m`` that declares a field) are in core/metrics_parts.py."""

from __future__ import annotations

from typing import Annotated, Any, get_args, get_origin, get_type_hints

import msgspec
from msgspec import Meta

from uma_serve.core.metrics_parts import (
    Histograms,
    QosHistograms,
    RequestsByReason,
    TickTokens,
    TokenHistograms,
    TunerState,
    _m,
)


class MetricsSnapshot(msgspec.Struct, kw_only=True):
    """The core's ``metrics`` answer (MetricsEvent.metrics, as a JSON object)."""

    uptime_s: Annotated[
        float,
        _m(
            "seconds since the daemon started",
            "uma_core_uptime_seconds",
            "Seconds since the core started.",
        ),
    ] = 0.0
    decode_ms_last: Annotated[
        float,
        _m(
            "wall time of the last `llama_decode` (one tick), ms",
            "uma_decode_last_seconds",
            "llama_decode time of the last tick.",
            per_unit=1000.0,
        ),
    ] = 0.0
    decode_ms_ewma: Annotated[
        float,
        _m(
            "EWMA (alpha 0.2) of the tick time (from `llama_decode` until the device is done), ms "
            "(a figure for dashboards; the policy plans with the tick-time model)",
            "uma_decode_ewma_seconds",
            "EWMA of llama_decode time per tick.",
            per_unit=1000.0,
        ),
    ] = 0.0
    tokens_per_tick: Annotated[TickTokens, _m("tokens in the last tick's batch, by phase")] = (
        msgspec.field(default_factory=TickTokens)
    )
    batch_size_last: Annotated[
        int,
        _m(
            "decode + prefill tokens of the last tick",
            "uma_batch_size_last",
            "Tokens in the last tick's batch.",
        ),
    ] = 0
    served_decoders: Annotated[
        int,
        _m(
            "sequences that got a decode token in the last tick",
            "uma_served_decoders",
            "Sequences decoded in the last tick.",
        ),
    ] = 0
    parked_sessions: Annotated[
        int,
        _m(
            "decoding sessions the policy skipped in the last tick (they keep their KV)",
            "uma_num_requests_parked",
            "Decoders the policy skipped last tick.",
        ),
    ] = 0
    active_sessions: Annotated[
        int,
        _m(
            "requests holding a sequence (prefilling or decoding)",
            "uma_num_requests_running",
            "Requests holding a sequence in the core.",
        ),
    ] = 0
    waiting_sessions: Annotated[
        int,
        _m(
            "admitted requests waiting for a free sequence",
            "uma_num_requests_waiting",
            "Requests queued for a sequence.",
        ),
    ] = 0
    kv_cells_used: Annotated[
        int,
        _m(
            "KV cells in use (sum of `n_past` of running sequences)",
            "uma_kv_cells_used",
            "KV cache cells in use.",
        ),
    ] = 0
    kv_cells_total: Annotated[
        int,
        _m("KV cells in all (`n_ctx`)", "uma_kv_cells_capacity", "KV cache cells in all.", "gauge"),
    ] = 0
    kv_cache_usage_ratio: Annotated[
        float,
        _m(
            "`kv_cells_used / kv_cells_total`",
            "uma_kv_cache_usage_ratio",
            "Used share of the KV cache (0-1).",
            vllm="uma_kv_cache_usage_perc",  # a share 0-1 too, despite the name (as vLLM's)
        ),
    ] = 0.0
    tokens_generated_total: Annotated[
        int,
        _m("tokens sampled for all requests", "uma_generation_tokens_total", "Tokens generated."),
    ] = 0
    prompt_tokens_total: Annotated[
        int, _m("prompt tokens prefilled", "uma_prompt_tokens_total", "Prompt tokens prefilled.")
    ] = 0
    batch_calls_total: Annotated[
        int,
        _m("`llama_decode` calls (ticks)", "uma_batch_calls_total", "llama_decode calls (ticks)."),
    ] = 0
    engine_busy_seconds_total: Annotated[
        float,
        _m(
            "the engine's wall time from one tick's launch to the next, while busy (seconds)",
            "uma_engine_busy_seconds_total",
            "Engine wall time between consecutive ticks while busy.",
        ),
    ] = 0.0
    engine_host_seconds_total: Annotated[
        float,
        _m(
            "the part of the busy time outside `llama_decode` and its wait for the device "
            "(sampling, detokenizing, scheduling, events): on a GPU the device waits meanwhile; "
            "host / busy is the engine's idle share (bench's scorecard)",
            "uma_engine_host_seconds_total",
            "Engine busy time outside llama_decode and the device wait.",
        ),
    ] = 0.0
    decode_graph_rebuilds_total: Annotated[
        int,
        _m(
            "ticks whose `llama_decode` built its graph anew (the batch's rows or the KV span "
            "changed): on a GPU such a tick and the one after it run without a replayed CUDA "
            "graph, each costing about a tick more (docs/GPU.md)",
            "uma_decode_graph_rebuilds_total",
            "Ticks that rebuilt the decode graph.",
        ),
    ] = 0
    decode_failures_total: Annotated[
        int,
        _m(
            "`llama_decode` calls that returned an error (soft: retried smaller)",
            "uma_decode_failures_total",
            "llama_decode calls that failed.",
        ),
    ] = 0
    requests_total: Annotated[RequestsByReason, _m("finished requests by end reason")] = (
        msgspec.field(default_factory=RequestsByReason)
    )
    prefill_guard_active: Annotated[
        int,
        _m(
            "0/1: a guard held work back in the last tick, or hysteresis holds background prefill",
            "uma_prefill_guard_active",
            "1 when a guard held back work in the last tick (or hysteresis holds prefill).",
        ),
    ] = 0
    ticks_over_budget_total: Annotated[
        int,
        _m(
            "ticks with background work whose decode time passed the guard's budget (each starts "
            "a hold)",
            "uma_ticks_over_budget_total",
            "Ticks whose decode time passed the budget the guard planned for.",
        ),
    ] = 0
    ticks_aborted_total: Annotated[
        int,
        _m(
            "ticks of bulk work only stopped mid-decode because a chat turn arrived (a CPU honours "
            "the stop, a GPU does not); their work is redone",
            "uma_ticks_aborted_total",
            "Background ticks stopped mid-decode because an interactive request arrived.",
        ),
    ] = 0
    ticks_paused_total: Annotated[
        int,
        _m(
            "pauses: protected ticks that carry a step's worth of bulk prompt, where any prefill "
            'makes a tick a step slower (a GPU; docs/POLICY.md, "The guard"); 0 on a CPU',
            "uma_ticks_paused_total",
            "Whole-batch background ticks among interactive ones (stepped tick cost: a GPU).",
        ),
    ] = 0
    tick_ms_predicted_last: Annotated[
        float,
        _m(
            "the tick-time model's prediction for the last tick, ms (compare `decode_ms_last`)",
            "uma_tick_predicted_seconds",
            "The tick-time model's prediction for the last tick.",
            per_unit=1000.0,
        ),
    ] = 0.0
    tick_budget_ms_last: Annotated[
        float,
        _m(
            "the time budget the guard planned the last tick for, ms",
            "uma_tick_budget_seconds",
            "The time budget of the last tick.",
            per_unit=1000.0,
        ),
    ] = 0.0
    tick_overhead_ms_ewma: Annotated[
        float,
        _m(
            "engine time per tick outside the decode and its wait for the device (sampling, "
            "detokenizing, batch building), smoothed, ms",
            "uma_tick_overhead_ewma_seconds",
            "Engine time per tick outside llama_decode, smoothed.",
            per_unit=1000.0,
        ),
    ] = 0.0
    bmt_estimate_last: Annotated[
        float,
        _m(
            "the bandwidth guard's estimate of the bytes the last tick moves: weights plus "
            "attended KV (0 without `--bmt-budget`)",
            "uma_bmt_estimate_bytes",
            "Estimated bytes the last tick moved.",
        ),
    ] = 0.0
    bmt_budget: Annotated[
        float,
        _m(
            "the bandwidth guard's budget in bytes/s (`--bmt-budget`; 0: guard off)",
            "uma_bmt_budget_bytes_per_second",
            "the bandwidth guard's budget (0: off).",
        ),
    ] = 0.0
    tuner: Annotated[
        TunerState,
        _m(
            "the sweet-spot tuner's settings: background decoders served per tick, and ticks a "
            "served background decoder keeps its turn (docs/POLICY.md)"
        ),
    ] = msgspec.field(default_factory=TunerState)
    prefix_cache_queries_total: Annotated[
        int,
        _m(
            "admitted requests looked up in the prefix cache",
            "uma_prefix_cache_queries_total",
            "Admitted requests looked up in the prefix cache.",
        ),
    ] = 0
    prefix_cache_hits_total: Annotated[
        int,
        _m(
            "of those, requests that reused a prefix: a cached entry's, or a running sequence's "
            "(docs/MEMORY.md)",
            "uma_prefix_cache_hits_total",
            "Admitted requests that reused a cached prefix.",
        ),
    ] = 0
    prompt_tokens_reused_total: Annotated[
        int,
        _m(
            "prompt tokens taken from a recent prompt's tokenization up to a boundary no token "
            "spans, instead of tokenizing them again (core/prompt_tokens.py)",
            "uma_prompt_tokens_reused_total",
            "Prompt tokens taken from a recent prompt's tokenization (not tokenized again).",
        ),
    ] = 0
    prefix_cache_cached_tokens_total: Annotated[
        int,
        _m(
            "prompt tokens whose KV was copied from either (not prefilled)",
            "uma_prefix_cache_cached_tokens_total",
            "Prompt tokens whose KV came from the prefix cache instead of prefill.",
        ),
    ] = 0
    prefix_cache_resident_tokens: Annotated[
        int,
        _m(
            "KV cells the cache holds (cells shared by entries counted once)",
            "uma_prefix_cache_resident_tokens",
            "KV cells held by the prefix cache (cells shared between entries counted once).",
        ),
    ] = 0
    prefix_cache_entries: Annotated[
        int, _m("cached prefixes resident", "uma_prefix_cache_entries", "Cached prefixes resident.")
    ] = 0
    prefix_cache_evictions_total: Annotated[
        int,
        _m(
            "times the whole cache was dropped because running sequences needed the KV",
            "uma_prefix_cache_evictions_total",
            "Times the whole prefix cache was dropped because running sequences needed the KV.",
        ),
    ] = 0
    spec_drafted_tokens_total: Annotated[
        int,
        _m(
            "prompt-lookup draft tokens verified",
            "uma_spec_drafted_tokens_total",
            "Prompt-lookup draft tokens verified by speculative decoding.",
        ),
    ] = 0
    spec_accepted_tokens_total: Annotated[
        int,
        _m(
            "draft tokens accepted (equal to what the model sampled)",
            "uma_spec_accepted_tokens_total",
            "Draft tokens accepted (identical to what the model sampled).",
        ),
    ] = 0
    spec_acceptance_rate: Annotated[
        float,
        _m(
            "accepted / drafted since start",
            "uma_spec_acceptance_rate",
            "Accepted / drafted tokens of speculative decoding since start.",
        ),
    ] = 0.0
    histograms: Annotated[Histograms, _m("latency histograms (ms)")] = msgspec.field(
        default_factory=Histograms
    )
    token_histograms: Annotated[TokenHistograms, _m(
        "tokens per finished request (bounds in tokens)")] = msgspec.field(
        default_factory=TokenHistograms)  # fmt: skip
    histograms_by_qos: Annotated[QosHistograms, _m(
        "the TTFT and inter-token histograms per class")] = msgspec.field(
        default_factory=QosHistograms)  # fmt: skip


def metric_fields(cls: type = MetricsSnapshot, prefix: str = "") -> list[tuple[str, Any, Meta]]:
    """Every documented field of the snapshot, the histograms' as ``histograms.ttft_ms``:
    (path, type, its Meta: ``description``, and ``extra`` naming its Prometheus family)."""
    out: list[tuple[str, Any, Meta]] = []
    for name, hint in get_type_hints(cls, include_extras=True).items():
        if get_origin(hint) is not Annotated:
            continue
        t, meta = get_args(hint)[0], get_args(hint)[1]
        out.append((prefix + name, t, meta))
        if t in (Histograms, TokenHistograms, QosHistograms):
            out.extend(metric_fields(t, f"{prefix}{name}."))
    return out
