"""umad's options, each declared once: a field of ``Config`` with its type, default, help
text and YAML key (``option``). core/config.py derives --help, the UMA_* environment names,
the YAML keys, the checks of ``least`` and docs/CONFIG.md's table from them, in this order."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from uma_serve.core.policy.pipeline import TRANSFORMERS
from uma_serve.core.socket_path import default_socket

# --deterministic: tokens per decode at most (ggml's CPU flash attention takes its tiled
# kernel from 64 query rows up, another kernel with other rounding)
DETERMINISTIC_BATCH = 63


def option(default: Any, help: str, yaml: str | None = "", *, least: float | None = None) -> Any:
    """A Config field: its default, its --help text, its YAML key ('': the option's name;
    None: not settable in YAML) and, with ``least``, the smallest value it takes."""
    return field(default=default, metadata={"help": help, "yaml": yaml, "least": least})


@dataclass(frozen=True)
class Config:
    model: str | None = option(None, "GGUF model path (default: the embedded Gemma 3 270M Q4_K_M)")
    socket: str = option(
        default_socket(),  # this user's (core/socket_path.py)
        "Unix socket path the daemon listens on (mode 0600). The default is in a directory "
        "only this user can write, created with mode 0700: $XDG_RUNTIME_DIR/uma/ (without "
        "XDG_RUNTIME_DIR: /run/uma/ for root, /tmp/uma-UID/ for others)",
        "ipc.uds_path",
    )
    n_seq: int = option(4, "sequences decoded in parallel, like llama-server's --parallel")
    n_ctx: int = option(8192, "total KV cache size in tokens, shared by all sequences")
    contexts: int = option(
        0,
        "llama.cpp contexts the model runs in, each with its share of n_seq and n_ctx, "
        "stepped in turn (one's host work while the GPU computes another's tick); streams "
        "spread over them and bulk work joins them (0: auto: with GPU layers and n_seq of 32 "
        "or more, one per 16 sequences, at most 4, for a model file of 2 GiB or less, else 2; "
        "otherwise 1)",
        least=0,
    )
    n_batch: int = option(512, "logical batch: tokens per llama_decode at most")
    n_ubatch: int = option(512, "physical batch: tokens per compute graph")
    threads: int = option(0, "CPU threads for decode (0: all cores)")
    n_gpu_layers: int = option(0, "layers offloaded to the GPU in a GPU build (-1: all)")
    split_mode: str = option(
        "layer",
        "a model over several GPUs (llama.cpp's split): none (all on --main-gpu), layer (whole "
        "layers and their KV per GPU) or row (each layer's rows across the GPUs)",
    )
    tensor_split: str = option(
        "",
        "each GPU's share of the model with --split-mode layer or row, comma-separated "
        "proportions in device order, e.g. 3,1 ('': by free memory)",
    )
    main_gpu: int = option(
        0,
        "the GPU that holds the whole model with --split-mode none (with row: the "
        "intermediate results and KV)",
    )
    max_sessions: int = option(
        64,
        "requests in flight at most (running + waiting); more get E_BUSY_001",
        "limits.max_sessions",
    )
    max_prompt_bytes: int = option(
        262144, "largest prompt in UTF-8 bytes (E_LIMIT_001)", "limits.max_prompt_bytes"
    )
    max_tokens: int = option(
        4096, "largest max_tokens a request may ask for (E_LIMIT_002)", "limits.max_tokens"
    )
    max_frame_bytes: int = option(
        1 << 20, "largest request frame; larger closes the connection", "ipc.max_frame"
    )
    max_write_buffer_bytes: int = option(
        1 << 20,
        "unread bytes queued for a client before its requests are cancelled (E_IO_001)",
        "ipc.max_write_buffer",
    )
    idle_timeout: float = option(
        300.0,
        "seconds a connection with nothing in flight may stay silent (0: forever)",
        "limits.idle_timeout",
    )
    drain_timeout: float = option(
        30.0,
        "on SIGTERM/SIGINT, seconds running requests may take to finish (new ones get "
        "E_SHUTDOWN_001) before they are cancelled; a second signal ends the drain at once",
        "scheduler.drain_timeout",
        least=0,
    )
    tick_budget_ms: float = option(
        50.0,
        "baseline policy (no latency guard): wall time a tick with decoders stays within",
        "scheduler.tick_budget_ms",
    )
    prefill_burst: int = option(
        256,
        "prompt tokens one request prefills per round of the rotation",
        "scheduler.prefill_burst",
    )
    policy: str = option(
        "qos,spec,latency,bmt",
        "plan transformers after the baseline, in order, comma-separated, from "
        f"{', '.join(TRANSFORMERS)} ('' = baseline only)",
        "scheduler.policy",
    )
    tuner: bool = option(
        True,
        "sweet-spot tuner (--no-tuner or off: none): hill-climbs how many background streams "
        "the qos lanes decode per tick and for how many ticks in a row",
        "scheduler.tuner",
    )
    slo_tbt_ms: float = option(
        0.0,
        "inter-token budget while any stream decodes (0: auto, (1 + headroom) x "
        "the predicted tick of the protected work alone)",
        "scheduler.slo_tbt_ms",
        least=0,
    )
    slo_ttft_ms: float = option(
        250.0,
        "a chat turn's prefill target: a prompt whose uncached part one tick prefills within "
        "it (and within --n-batch) is a chat turn, prefilled first; longer ones are bulk "
        "work (0: bg_tick_ms)",
        "scheduler.slo_ttft_ms",
        least=0,
    )
    headroom: float = option(
        0.2, "auto inter-token budget: allowed slowdown over solo", "scheduler.headroom", least=0
    )
    bg_tick_ms: float = option(
        60.0,
        "bound on ticks of bulk work only while a conversation is recent (bounds a chat "
        "turn's wait where a tick cannot be cut short)",
        "scheduler.bg_tick_ms",
    )
    quiet_ms: float = option(
        1000.0,
        "after this long without a chat turn, ticks of bulk work are bounded by --n-batch "
        "only (faster prefill; a chat turn's arrival cuts such a tick short on a CPU) "
        "(0: always --bg-tick-ms)",
        "scheduler.quiet_ms",
        least=0,
    )
    hold_ticks: int = option(
        8,
        "ticks background prefill is held after an over-budget tick (hysteresis)",
        "scheduler.hold_ticks",
    )
    pause_every: int = option(
        100,
        "where any prefill makes a tick a step slower (a GPU), background prefill comes as "
        "whole-batch pauses that stretch at most one interactive gap in this many (100: 1 percent, "
        "so ITL p95 stays at solo)",
        "scheduler.pause_every",
    )
    compute_nice: int = option(
        5,
        "raise the compute threads' nice value by this much (the engine thread and llama.cpp's "
        "workers, which inherit it; the I/O threads keep theirs): the socket, the gateway and "
        "the user's other programs then preempt token compute at once (0: off)",
        None,
    )
    starve_ms: float = option(
        2000.0,
        "longest wait between two advances of any request",
        "scheduler.starve_ms",
        least=0,
    )
    bmt_budget: float = option(
        0.0,
        "bandwidth guard: the machine's bandwidth in GB/s; the bytes a tick moves (weights plus "
        "attended KV) stay within it times the tick's time budget (0: off; `bench calibrate` "
        "measures it)",
        "scheduler.bmt_budget",
        least=0,
    )
    reserved_interactive_seqs: int = option(
        1,
        "sequences background requests may not take, kept for interactive ones",
        "scheduler.reserved_interactive_seqs",
    )
    sampler: str = option(
        "auto",
        "where each row's sampling candidates come from: numpy (the whole logits row, read on "
        "the host without a copy), backend-topk (a top-64 kept inside the decode graph; a "
        "request that needs its whole row, e.g. with penalties or logprobs, reads it; a "
        "grammar's request a top-16,384), auto (backend-topk when layers run on a GPU, else "
        "numpy: the faster in our "
        "measurements, docs/BENCHMARKS.md); the chain after that is the same",
        "scheduler.sampler",
    )
    prefix_cache_tokens: int = option(
        -1,  # auto: config.prefix_cache_size
        "prefix cache: KV cells finished sequences may keep resident for reuse by later "
        "prompts (-1: a quarter of --n-ctx, at least 4096; 0: off; on, the SWA layers keep "
        "full-size KV: docs/MEMORY.md)",
        "cache.prefix_cache_tokens",
    )
    prefix_cache_slots: int = option(
        -1,  # auto: config.prefix_cache_size
        "prefix cache: cached prefixes at most (extra sequence ids in the context; -1: "
        "--n-seq, at least 8)",
        "cache.prefix_cache_slots",
    )
    spec_draft: int = option(
        -1,
        "speculative decoding (policy 'spec'): prompt-lookup tokens verified per tick at most "
        "(0: off; -1: 6 on the CPU, off when layers run on a GPU, where verification ticks "
        "cost more than they save: docs/BENCHMARKS.md)",
        "scheduler.spec_draft",
    )
    spec_max_streams: int = option(
        4,
        "speculative decoding only while at most this many streams decode",
        "scheduler.spec_max_streams",
        least=0,
    )
    pin_prefix: str = option(
        "",
        "a text file (e.g. a system prompt) whose KV the prefix cache keeps resident; saved as "
        "FILE.<model>.kv and restored at the next start instead of recomputed",
        "cache.pin_prefix",
    )
    chat_template: str = option(
        "",
        "a Jinja chat template file used instead of the GGUF's own (or the shipped one): it "
        "gets messages (role, content), add_generation_prompt, bos_token and eos_token",
    )
    seed: int | None = option(None, "seed for requests that give none (default: random)")
    deterministic: bool = option(
        False,
        "a request's output depends only on the request (greedy text, and sampled text "
        "with a seed, bit-identical whatever ran before): one request at a time, decodes of "
        f"2..{DETERMINISTIC_BATCH} tokens, the prefix cache's entries kept on the host "
        '(docs/MEMORY.md, "Reproducible greedy output"); overrides --n-seq, --n-batch, '
        "--n-ubatch. CPU backend",
    )
    log_level: str = option(
        "info",
        "debug, info, warning or error (debug: a line per tick, and ggml's messages past "
        "start-up, one per decode on a GPU)",
    )
    log_format: str = option(
        "text",
        "text (a line for a person) or json (one JSON object a line: time, level, logger, "
        "message, core and the fields a line carries such as request_id; docs/DEPLOY.md)",
    )


# name -> (help, YAML key or None), in declaration order: what --help and the YAML reader use
OPTIONS: dict[str, tuple[str, str | None]] = {
    f.name: (f.metadata["help"], f.name if f.metadata["yaml"] == "" else f.metadata["yaml"])
    for f in fields(Config)
}
# name -> the smallest value it takes, for the options that declare one
LEAST: dict[str, float] = {
    f.name: f.metadata["least"] for f in fields(Config) if f.metadata["least"] is not None
}
