"""umad's options: each one's help text and YAML key, in the order of `umad --help` and
docs/CONFIG.md's table (core/config.py declares their types and defaults in Config)."""

from __future__ import annotations

# --deterministic: tokens per decode at most (ggml's CPU flash attention takes its tiled
# kernel from 64 query rows up, another kernel with other rounding)
DETERMINISTIC_BATCH = 63


# name -> (help, YAML key or None)
OPTIONS: dict[str, tuple[str, str | None]] = {
    "model": ("GGUF model path (default: the embedded Gemma 3 270M Q4_K_M)", "model"),
    "socket": (
        "Unix socket path the daemon listens on (mode 0600). The default is in a directory "
        "only this user can write, created with mode 0700: $XDG_RUNTIME_DIR/uma/ (without "
        "XDG_RUNTIME_DIR: /run/uma/ for root, /tmp/uma-UID/ for others)",
        "ipc.uds_path",
    ),
    "n_seq": ("sequences decoded in parallel, like llama-server's --parallel", "n_seq"),
    "n_ctx": ("total KV cache size in tokens, shared by all sequences", "n_ctx"),
    "n_batch": ("logical batch: tokens per llama_decode at most", "n_batch"),
    "n_ubatch": ("physical batch: tokens per compute graph", "n_ubatch"),
    "threads": ("CPU threads for decode (0: all cores)", "threads"),
    "n_gpu_layers": ("layers offloaded to the GPU in a GPU build (-1: all)", "n_gpu_layers"),
    "split_mode": (
        "a model over several GPUs (llama.cpp's split): none (all on --main-gpu), layer (whole "
        "layers and their KV per GPU) or row (each layer's rows across the GPUs)",
        "split_mode",
    ),
    "tensor_split": (
        "each GPU's share of the model with --split-mode layer or row, comma-separated "
        "proportions in device order, e.g. 3,1 ('': by free memory)",
        "tensor_split",
    ),
    "main_gpu": (
        "the GPU that holds the whole model with --split-mode none (with row: the "
        "intermediate results and KV)",
        "main_gpu",
    ),
    "max_sessions": (
        "requests in flight at most (running + waiting); more get E_BUSY_001",
        "limits.max_sessions",
    ),
    "max_prompt_bytes": ("largest prompt in UTF-8 bytes (E_LIMIT_001)", "limits.max_prompt_bytes"),
    "max_tokens": ("largest max_tokens a request may ask for (E_LIMIT_002)", "limits.max_tokens"),
    "max_frame_bytes": ("largest request frame; larger closes the connection", "ipc.max_frame"),
    "max_write_buffer_bytes": (
        "unread bytes queued for a client before its requests are cancelled (E_IO_001)",
        "ipc.max_write_buffer",
    ),
    "idle_timeout": (
        "seconds a connection with nothing in flight may stay silent (0: forever)",
        "limits.idle_timeout",
    ),
    "drain_timeout": (
        "on SIGTERM/SIGINT, seconds running requests may take to finish (new ones get "
        "E_SHUTDOWN_001) before they are cancelled; a second signal ends the drain at once",
        "scheduler.drain_timeout",
    ),
    "tick_budget_ms": (
        "baseline policy (no latency guard): wall time a tick with decoders stays within",
        "scheduler.tick_budget_ms",
    ),
    "prefill_burst": (
        "prompt tokens one request prefills per round of the rotation",
        "scheduler.prefill_burst",
    ),
    "policy": (
        "plan transformers after the baseline, in order, comma-separated, from qos, spec, "
        "latency, bmt ('' = baseline only)",
        "scheduler.policy",
    ),
    "tuner": (
        "sweet-spot tuner (--no-tuner or off: none): hill-climbs how many background streams "
        "the qos lanes decode per tick and for how many ticks in a row",
        "scheduler.tuner",
    ),
    "slo_tbt_ms": (
        "inter-token budget while any stream decodes (0: auto, (1 + headroom) x "
        "the predicted tick of the protected work alone)",
        "scheduler.slo_tbt_ms",
    ),
    "slo_ttft_ms": (
        "a chat turn's prefill target: a prompt whose uncached part one tick prefills within "
        "it (and within --n-batch) is a chat turn, prefilled first; longer ones are bulk "
        "work (0: bg_tick_ms)",
        "scheduler.slo_ttft_ms",
    ),
    "headroom": ("auto inter-token budget: allowed slowdown over solo", "scheduler.headroom"),
    "bg_tick_ms": (
        "bound on ticks of bulk work only while a conversation is recent (bounds a chat "
        "turn's wait where a tick cannot be cut short)",
        "scheduler.bg_tick_ms",
    ),
    "quiet_ms": (
        "after this long without a chat turn, ticks of bulk work are bounded by --n-batch "
        "only (faster prefill; a chat turn's arrival cuts such a tick short on a CPU) "
        "(0: always --bg-tick-ms)",
        "scheduler.quiet_ms",
    ),
    "hold_ticks": (
        "ticks background prefill is held after an over-budget tick (hysteresis)",
        "scheduler.hold_ticks",
    ),
    "pause_every": (
        "where any prefill makes a tick a step slower (a GPU), background prefill comes as "
        "whole-batch pauses that stretch at most one interactive gap in this many (100: 1 percent, "
        "so ITL p95 stays at solo)",
        "scheduler.pause_every",
    ),
    "compute_nice": (
        "raise the compute threads' nice value by this much (the engine thread and llama.cpp's "
        "workers, which inherit it; the I/O threads keep theirs): the socket, the gateway and "
        "the user's other programs then preempt token compute at once (0: off)",
        None,
    ),
    "starve_ms": ("longest wait between two advances of any request", "scheduler.starve_ms"),
    "bmt_budget": (
        "bandwidth guard: the machine's bandwidth in GB/s; the bytes a tick moves (weights plus "
        "attended KV) stay within it times the tick's time budget (0: off; `bench calibrate` "
        "measures it)",
        "scheduler.bmt_budget",
    ),
    "reserved_interactive_seqs": (
        "sequences background requests may not take, kept for interactive ones",
        "scheduler.reserved_interactive_seqs",
    ),
    "sampler": (
        "where each row's sampling candidates come from: numpy (the whole logits row, read on "
        "the host without a copy), backend-topk (a top-64 kept inside the decode graph; a "
        "request that needs its whole row, e.g. with penalties, a grammar or logprobs, reads "
        "it), auto (backend-topk when layers run on a GPU, else numpy: the faster in our "
        "measurements, docs/BENCHMARKS.md); the chain after that is the same",
        "scheduler.sampler",
    ),
    "prefix_cache_tokens": (
        "prefix cache: KV cells finished sequences may keep resident for reuse by later "
        "prompts (-1: a quarter of --n-ctx, at least 4096; 0: off; on, the SWA layers keep "
        "full-size KV: docs/MEMORY.md)",
        "cache.prefix_cache_tokens",
    ),
    "prefix_cache_slots": (
        "prefix cache: cached prefixes at most (extra sequence ids in the context; -1: "
        "--n-seq, at least 8)",
        "cache.prefix_cache_slots",
    ),
    "spec_draft": (
        "speculative decoding (policy 'spec'): prompt-lookup tokens verified per tick at most "
        "(0: off; -1: 6 on the CPU, off when layers run on a GPU, where verification ticks "
        "cost more than they save: docs/BENCHMARKS.md)",
        "scheduler.spec_draft",
    ),
    "spec_max_streams": (
        "speculative decoding only while at most this many streams decode",
        "scheduler.spec_max_streams",
    ),
    "pin_prefix": (
        "a text file (e.g. a system prompt) whose KV the prefix cache keeps resident; saved as "
        "FILE.<model>.kv and restored at the next start instead of recomputed",
        "cache.pin_prefix",
    ),
    "chat_template": (
        "a Jinja chat template file used instead of the GGUF's own (or the shipped one): it "
        "gets messages (role, content), add_generation_prompt, bos_token and eos_token",
        "chat_template",
    ),
    "seed": ("seed for requests that give none (default: random)", "seed"),
    "deterministic": (
        "a request's output depends only on the request (greedy text, and sampled text "
        "with a seed, bit-identical whatever ran before): one request at a time, decodes of "
        f"2..{DETERMINISTIC_BATCH} tokens, the prefix cache's entries kept on the host "
        '(docs/MEMORY.md, "Reproducible greedy output"); overrides --n-seq, --n-batch, '
        "--n-ubatch. CPU backend",
        "deterministic",
    ),
    "log_level": (
        "debug, info, warning or error (debug: a line per tick, and ggml's messages past "
        "start-up, one per decode on a GPU)",
        "log_level",
    ),
    "log_format": (
        "text (a line for a person) or json (one JSON object a line: time, level, logger, "
        "message, core and the fields a line carries such as request_id; docs/DEPLOY.md)",
        "log_format",
    ),
}
