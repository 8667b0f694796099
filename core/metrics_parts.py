"""The metrics snapshot's parts: the nested structs, and ``_m``, the one place a field's
meaning and Prometheus family are declared. core/metrics_schema.py builds MetricsSnapshot
from them (apart so that neither module outgrows 400 lines)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta


def _m(
    doc: str,
    prom: str = "",
    prom_help: str = "",
    kind: str = "",
    *,
    per_unit: float = 1.0,
    vllm: str = "",
) -> Meta:
    """A field's meaning and, with ``prom``, the Prometheus family the gateway exports it as
    (kind: counter for a ``*_total`` field, else gauge, unless given). ``per_unit``: snapshot
    units per exported unit (1000: a field in ms exported in seconds, as Prometheus wants base
    units). ``vllm``: the same figure again under vLLM's name where ours differs, so that a
    vLLM dashboard works after replacing ``vllm:`` by ``uma_``."""
    if not prom:
        return Meta(description=doc, extra={})
    extra = {"prom": prom, "prom_help": prom_help, "kind": kind, "per_unit": per_unit}
    return Meta(description=doc, extra=extra | ({"vllm": vllm} if vllm else {}))


class TickTokens(msgspec.Struct):
    decode: int = 0
    prefill: int = 0


class RequestsByReason(msgspec.Struct):
    stop: int = 0
    length: int = 0
    cancelled: int = 0
    error: int = 0


class TunerState(msgspec.Struct):
    bg_decoders_cap: int = 0
    bg_burst: int = 1


class Histogram(msgspec.Struct):
    """``bounds``: upper bounds (+Inf implied) in ms, or in tokens for ``token_histograms``;
    ``counts``: per bucket, one more than ``bounds``; a value equal to a bound falls in that
    bound's bucket."""

    bounds: list[float] = []
    counts: list[int] = []
    sum: float = 0.0
    count: int = 0


def _h(doc: str, prom: str, prom_help: str, per_unit: float = 1000.0, vllm: str = "") -> Meta:
    """A histogram's declaration: in ms exported in seconds, unless ``per_unit`` says else."""
    return _m(doc, prom, prom_help, "histogram", per_unit=per_unit, vllm=vllm)


_TTFT = ("uma_time_to_first_token_seconds", "Time from arrival to the first token.")
_ITL = ("uma_inter_token_latency_seconds", "Time between consecutive tokens.")
_TPOT = "uma_time_per_output_token_seconds"  # vLLM's older name for the inter-token time
_E2E = ("uma_e2e_request_latency_seconds", "Time from arrival to the end of a request.")
_QUEUE = ("uma_request_queue_time_seconds", "Time a request waited before its prefill.")
_QOS_TTFT = ("uma_qos_time_to_first_token_seconds", "Time to the first token, by QoS class.")
_QOS_ITL = ("uma_qos_inter_token_latency_seconds", "Inter-token gaps, by QoS class.")
_PREFILL = ("uma_request_prefill_time_seconds", "Time from admission to the first token.")
_DECODE = ("uma_request_decode_time_seconds", "Time from the first token to the last.")
_MAX_GEN = ("uma_request_max_num_generation_tokens", "max_tokens of each finished request.")
_PROMPT = ("uma_request_prompt_tokens", "Prompt tokens of each finished request.")
_GENERATED = ("uma_request_generation_tokens", "Tokens generated for each finished request.")
_TICK_DECODE = ("uma_tick_decode_seconds", "Each tick's llama_decode, launch to device done.")
_TICK_SAMPLE = ("uma_tick_sample_seconds", "Each tick's sampling of its logits rows.")
_TICK_OVERLAP = ("uma_tick_overlap_seconds", "Host work done while a tick's device computed.")
_NEW_H = msgspec.field(default_factory=Histogram)


class Histograms(msgspec.Struct):
    ttft_ms: Annotated[Histogram, _h("arrival to first token", *_TTFT)] = _NEW_H
    inter_token_ms: Annotated[
        Histogram, _h("gap between consecutive tokens of one request", *_ITL, vllm=_TPOT)
    ] = _NEW_H
    e2e_ms: Annotated[Histogram, _h("arrival to final event", *_E2E)] = _NEW_H
    queue_ms: Annotated[Histogram, _h("arrival to the start of prefill", *_QUEUE)] = _NEW_H
    prefill_ms: Annotated[
        Histogram, _h("admission to the first token, per request that made one", *_PREFILL)
    ] = _NEW_H
    decode_ms: Annotated[
        Histogram, _h("first token to the request's end, per request that made one", *_DECODE)
    ] = _NEW_H
    tick_decode_ms: Annotated[
        Histogram,
        _h("each tick's `llama_decode`, launch to device done (less host work meanwhile)",
           *_TICK_DECODE),
    ] = _NEW_H  # fmt: skip
    tick_sample_ms: Annotated[
        Histogram, _h("each tick's sampling of its logits rows, after the device", *_TICK_SAMPLE)
    ] = _NEW_H
    tick_overlap_ms: Annotated[
        Histogram,
        _h("each tick's host work between launch and collection (on a GPU the device computes "
           "meanwhile): on a GPU the next tick's plan, new requests and finished sequences' "
           "release; on a CPU the release, 0 in most ticks", *_TICK_OVERLAP),
    ] = _NEW_H  # fmt: skip


class TokenHistograms(msgspec.Struct):
    """Tokens per finished core request (vLLM's request_prompt_tokens and
    request_generation_tokens), bounds in tokens: the request-size mix a latency alone hides."""

    prompt_tokens: Annotated[
        Histogram, _h("prompt tokens of each finished request", *_PROMPT, per_unit=1.0)
    ] = _NEW_H
    generation_tokens: Annotated[
        Histogram, _h("tokens generated for each finished request", *_GENERATED, per_unit=1.0)
    ] = _NEW_H
    max_generation_tokens: Annotated[
        Histogram, _h("max_tokens of each finished request", *_MAX_GEN, per_unit=1.0)
    ] = _NEW_H


class QosHistograms(msgspec.Struct):
    """Per class: ``interactive`` and ``background``."""

    ttft_ms: Annotated[
        dict[str, Histogram],
        _h(
            "TTFT by the prompt's class (a chat turn's is interactive, a long or labeled "
            "prompt's background)",
            *_QOS_TTFT,
        ),
    ] = {}
    inter_token_ms: Annotated[
        dict[str, Histogram], _h("inter-token gaps by the request's label", *_QOS_ITL)
    ] = {}


def prom_kind(path: str, meta: Meta) -> str:
    """gauge, counter or histogram: how the gateway exports a field (see _m)."""
    kind = (meta.extra or {}).get("kind") or ""
    return kind or ("counter" if path.endswith("_total") else "gauge")
