"""umad: load the model once, start the engine thread, serve the Unix socket until a signal."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from uma_serve.core import config as cfg, logfmt
from uma_serve.core.chat import ChatTemplate, ChatTemplateError, builtin_template
from uma_serve.core.engine import Engine
from uma_serve.core.faults import Faults
from uma_serve.core.metrics import EngineMetrics
from uma_serve.core.policy import Constraints, ModelFacts
from uma_serve.core.policy.cost import GPU_PRIOR, TickCost
from uma_serve.core.policy.pipeline import build_policy, option_overrides
from uma_serve.core.runtime import Runtime, RuntimeParams, gpu_offload
from uma_serve.core.runtime.grammar import FirstChars
from uma_serve.core.server import CoreServer
from uma_serve.core.socket_path import (
    SocketPathError,
    claim_socket_path,
    default_socket,
    make_private_dir,
)

log = logging.getLogger("uma.daemon")
T = TypeVar("T")


def on_passing_thread(work: Callable[..., T], *args: object) -> T:
    """Run a start-up decode (warm-up, a pinned prefix) on a thread that exits afterwards.
    llama.cpp's CPU backend runs a decode on an OpenMP team of the calling thread, and the
    team lives as long as that thread. A team left by the main thread beside the engine
    thread's made libgomp throttle its spin-waits (more threads than cores): each decode of the
    engine's was half as slow again (4 streams, 2-core Xeon: 30.9 -> 46.2 ms)."""
    with ThreadPoolExecutor(1, thread_name_prefix="uma-startup") as pool:
        return pool.submit(work, *args).result()


def deterministic(config: cfg.Config) -> cfg.Config:
    """--deterministic's overrides: one request at a time, every decode within
    DETERMINISTIC_BATCH tokens (docs/MEMORY.md, "Reproducible greedy output")."""
    if not config.deterministic:
        return config
    n = cfg.DETERMINISTIC_BATCH
    log.info("deterministic: one request at a time, decodes of 2..%d tokens", n)
    if gpu_offload(config.n_gpu_layers):
        log.warning("deterministic: checked on the CPU backend only, not with GPU layers")
    return replace(config, n_seq=1, n_batch=n, n_ubatch=n, reserved_interactive_seqs=0)


def runtime_params(config: cfg.Config, sampler: str, spec_draft: int) -> RuntimeParams:
    cache_tokens, cache_slots = cfg.prefix_cache_size(config)
    prefix_cache = cache_tokens > 0 and cache_slots > 0
    det = config.deterministic
    return RuntimeParams(
        model_path=config.model or cfg.default_model_path(),
        n_ctx=config.n_ctx,
        n_batch=config.n_batch,
        n_ubatch=config.n_ubatch,
        n_seq=config.n_seq,
        threads=config.threads,
        n_gpu_layers=config.n_gpu_layers,
        split_mode=config.split_mode,
        tensor_split=cfg.tensor_shares(config.tensor_split),
        main_gpu=config.main_gpu,
        # reusing a cached prefix needs the SWA layers' KV of every position it covers;
        # deterministic: no cell may be recycled either (its request's cells stay in
        # position order), and the cache's entries live on the host, not in the context.
        # A model with no window gets no shadows (the runtime drops them: nothing recycles)
        swa_full=prefix_cache or det,
        n_seq_cache=cache_slots if prefix_cache and not det else 0,
        shadow=prefix_cache or det,
        deterministic=det,
        flash_attn=1 if det else -1,
        # backend sampling: room for speculative verification's 1 + drafts outputs
        max_outputs_per_seq=spec_draft + 1 if sampler == "backend-topk" else 0,
        device_top_k=cfg.DEVICE_TOP_K if sampler == "backend-topk" else 0,
    )


# Weights a GPU reads again per extra context, cheaply (below). Only such a model's streams
# spread over the contexts from the first: a batch split in two costs a bigger model's tick
# its matmuls twice (Llama-3.1-8B's shape, 16 streams on an H100 over the socket: 1,571 /
# 1,607 tok/s in one context, 1,036 / 1,039 spread over two; Gemma 3 270M: 3,621 / 3,861 ->
# 4,838 / 5,686). A bigger model's streams fill a context up to FILL, then spread, so at 64
# streams every context starts its streams together (over the socket, against filling one
# context entirely: OLMoE-1B-7B's shape 5,228-5,581 against 4,373-4,781 tok/s, 8B's 2,896 /
# 2,913 against 2,450 / 2,472; 16 streams alike).
SMALL_MODEL_BYTES = 2 << 30
FILL = 16


def n_contexts(config: cfg.Config, on_gpu: bool, model_bytes: int) -> int:
    """--contexts, auto resolved. On a GPU from 32 sequences up: one context per 16
    sequences (four at most) for a model of 2 GiB or less, else two; one otherwise (a CPU's
    decode computes the tick: nothing to overlap). Each context's tick reads all the weights
    again: 64 streams on an H100 over the socket, tok/s with 1 / 2 / 4 contexts: Gemma 3 270M
    (0.24 GiB) 4,400-5,200 / 5,400-6,800 / 6,900-7,300; Gemma-3-1B's shape (0.9 GiB)
    3,700-4,800 / 4,800-5,900 / 5,900-6,200; 4B's (2.0 GiB) 3,300-3,400 / 3,850-3,900 /
    3,800; Llama-3.1-8B's (4.8 GiB) 2,962 / 3,135 / 2,653."""
    if config.contexts:
        return max(1, min(config.contexts, config.n_seq))
    if not on_gpu or config.n_seq < 32:
        return 1
    return min(4, config.n_seq // 16) if model_bytes <= SMALL_MODEL_BYTES else 2


def model_bytes(path: str) -> int:
    """The GGUF file's size: its weights, known before they load (0: no such file; the
    runtime reports it)."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def context_share(params: RuntimeParams, n: int, i: int) -> RuntimeParams:
    """Context ``i`` of ``n``: its share of the sequences, their cells and the cache ids.
    Several contexts on a GPU launch their decodes on their own threads: while one's
    llama_decode builds its batch and mask there, the engine thread works for the others."""
    seqs = params.n_seq // n + (i < params.n_seq % n)
    cache = params.n_seq_cache // n + (i < params.n_seq_cache % n)
    return replace(
        params,
        n_seq=seqs,
        n_ctx=params.n_ctx * seqs // params.n_seq,
        n_seq_cache=cache,
        launch_thread=n > 1 and gpu_offload(params.n_gpu_layers),
    )


def constraints(config: cfg.Config, facts: ModelFacts, on_gpu: bool = False) -> Constraints:
    """What every part of the policy plans within (a transformer's own knobs are its
    settings: core/policy/pipeline.py)."""
    return Constraints(
        n_batch=config.n_batch,
        tick_budget_ms=config.tick_budget_ms,
        prefill_burst=config.prefill_burst,
        slo_ttft_ms=config.slo_ttft_ms or None,
        bg_tick_ms=config.bg_tick_ms,
        starve_ms=config.starve_ms,
        model=facts,
        spec_max_draft=config.spec_draft,
        spec_max_streams=config.spec_max_streams,
        tick_prior=GPU_PRIOR if on_gpu else TickCost(),
    )


def build(config: cfg.Config) -> tuple[Runtime, Engine, CoreServer]:
    names = cfg.policy_names(config)
    config = replace(deterministic(config), **option_overrides(names))
    on_gpu = gpu_offload(config.n_gpu_layers)
    sampler = config.sampler
    if sampler == "auto":
        sampler = "backend-topk" if on_gpu else "numpy"
    spec_draft = config.spec_draft if config.spec_draft >= 0 else (0 if on_gpu else 6)
    config = replace(config, spec_draft=spec_draft)
    log.info("token sampling: %s; speculative draft: %d", sampler, spec_draft)
    faults = Faults.from_env()
    if faults.any:
        log.warning("fault injection on (tests only): %s", faults)
    params = runtime_params(config, sampler, spec_draft)
    n = n_contexts(config, on_gpu, model_bytes(params.model_path))
    runtime = Runtime(context_share(params, n, 0))
    runtimes = [runtime] + [Runtime(context_share(params, n, i), runtime) for i in range(1, n)]
    if n > 1:
        log.info("%d contexts of the model, stepped in turn", n)
    for rt in runtimes:
        on_passing_thread(rt.warm_up)
    # a grammar's first-byte table, built here rather than at the first grammar (0.39 s on a
    # 2-core CPU, every stream waiting); the contexts share the vocabulary
    first_chars = FirstChars(runtime.vocab)
    for rt in runtimes:
        rt.first_chars = first_chars
    cache_tokens, cache_slots = cfg.prefix_cache_size(config)
    if not (params.n_seq_cache or params.deterministic):
        cache_tokens = 0
    holder: dict[str, CoreServer] = {}
    engine = Engine(
        [faults.wrap(rt) for rt in runtimes],
        [build_policy(names, dataclasses.asdict(config)) for _ in runtimes],
        constraints(config, runtime.info.facts(), on_gpu),
        sink=lambda batch: holder["server"].sink(batch),
        metrics=EngineMetrics(),
        seed=config.seed,
        reserved_interactive=-(-config.reserved_interactive_seqs // n),  # each context's
        prefix_cache_tokens=cache_tokens // n,
        prefix_cache_slots=cache_slots // n,
        compute_nice=config.compute_nice,
        overlap=on_gpu,
        fill=0 if model_bytes(params.model_path) <= SMALL_MODEL_BYTES else FILL,
    )
    if config.pin_prefix:
        text = Path(config.pin_prefix).read_text()
        kv_path = f"{config.pin_prefix}.{Path(runtime.model_path).stem}.kv"
        status = on_passing_thread(engine.pin_prefix, runtime.tokenize(text), kv_path)
        log.info("pinned prefix %s: %s (%s)", config.pin_prefix, status, kv_path)
    if config.chat_template:
        template: str | None = Path(config.chat_template).read_text()
    else:
        template = runtime.info.chat_template or builtin_template(runtime.info.architecture)
    chat = ChatTemplate(template) if template and not faults.no_chat_template else None
    server = holder["server"] = CoreServer(config, runtime, engine, chat)
    return runtime, engine, server


async def serve(config: cfg.Config) -> None:
    runtime, engine, server = build(config)
    claim_socket_path(config.socket)  # again: the model took a while to load
    # what start-up made (modules, the model's metadata, the policy) lives as long as the
    # daemon: out of the collector, a full collection no longer walks it (5-7 ms here, a
    # pause in the token stream; 0 ms after)
    gc.collect()
    gc.freeze()
    engine.start()
    await server.start()
    log.info("umad ready on %s (model %s)", config.socket, runtime.model_name)
    first, again = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    received: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig.name)
        (again if first.is_set() else first).set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    await first.wait()
    name = received[0]
    log.info(
        "%s: draining: no new generations, %d in flight may finish within %g s "
        "(a second signal ends the drain)",
        name,
        server.in_flight(),
        config.drain_timeout,
    )
    cut = await server.drain(config.drain_timeout, again)
    if cut:
        log.warning("%s: cancelling the %d requests in flight", cut, server.in_flight())
    await server.shutdown(f"server shutting down ({name})" + (f": {cut}" if cut else ""))
    if not engine.alive:
        for sh in reversed(engine.shards):  # the first context's runtime frees the model
            sh.runtime.close()
    log.info("umad stopped")


def main(argv: list[str] | None = None) -> None:
    try:
        config = cfg.load(argv)
    except ValueError as exc:
        print(f"umad: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if config.chat_template:  # before the model loads: a bad template fails fast
        try:
            ChatTemplate(Path(config.chat_template).read_text())
        except (OSError, ChatTemplateError) as exc:
            print(f"umad: --chat-template {config.chat_template}: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
    logfmt.setup(config.log_level, config.log_format, {"core": config.socket})
    try:
        if config.socket == default_socket():
            make_private_dir(config.socket)
        claim_socket_path(config.socket)  # before the model loads: a bad path fails fast
        asyncio.run(serve(config))
    except (FileNotFoundError, RuntimeError, SocketPathError) as exc:
        print(f"umad: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
