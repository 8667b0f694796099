"""What the runtime is built from and what a batch is made of: plain data, no llama.cpp
(a request's sampling parameters are core/protocol.py's ``Sampling``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import msgspec


@dataclass(frozen=True)
class RuntimeParams:
    model_path: str
    n_ctx: int = 8192
    n_batch: int = 512
    n_ubatch: int = 512
    n_seq: int = 4
    threads: int = 0  # 0: all cores
    n_gpu_layers: int = 0
    split_mode: str = "layer"  # a model over several GPUs: none, layer or row (llama.cpp's)
    tensor_split: tuple[float, ...] = ()  # each GPU's share; () lets llama.cpp decide
    main_gpu: int = 0
    swa_full: bool = False
    kv_unified: bool = True
    n_seq_cache: int = 0  # extra sequence ids that hold cached prefixes (prefix cache)
    # Keep every cell of every sequence at two ids (its own and a shadow), so llama.cpp never
    # recycles it: its SWA cache reuses a cell owned by ONE sequence once it falls out of that
    # sequence's window, even with swa_full. A prefix that is reused later needs those cells.
    shadow: bool = False
    # backend sampling: outputs a sequence may have in one decode (speculative verification
    # asks for 1 + drafts); 0 = llama.cpp's default
    max_outputs_per_seq: int = 0
    # > 0: every running sequence's outputs pass a top-k of this size inside the decode graph,
    # so only k (id, logit) candidates per row reach the host (see candidates())
    device_top_k: int = 0
    # llama.cpp's flash attention: -1 auto (on where supported), 0 off, 1 on
    flash_attn: int = -1
    # --deterministic: a lone token is decoded with a throwaway companion on a spare sequence
    # id (so no decode has 1 token), and ggml's CPU matmuls use one kernel for every batch
    # size: with every decode kept within 2..63 tokens by the caller, a position's logits and
    # KV then depend only on the tokens before it (docs/MEMORY.md, "Reproducible greedy output")
    deterministic: bool = False
    # launch each llama_decode on a thread of the runtime's own (the GIL is released inside
    # it): the engine's Python work for the other contexts overlaps its host work
    launch_thread: bool = False


def shadows_needed(params: RuntimeParams, n_swa: int) -> RuntimeParams:
    """``params`` with shadow ids only where they guard something: llama.cpp reuses a cell
    that holds data only once it lies outside its sequence's sliding window, so a model with
    no window (``n_swa`` 0: SmolLM2, Llama) needs none; each would double the ids every decode
    checks and the passes of every trim and restore (docs/MEMORY.md)."""
    return replace(params, shadow=False) if params.shadow and n_swa <= 0 else params


class Span(msgspec.Struct, frozen=True):
    """Consecutive tokens of one sequence in the batch, from position ``pos``."""

    seq_id: int
    pos: int
    tokens: list[int]
    logits: bool  # logits for the span's last token
    all_logits: bool = False  # logits for every token (speculative verification)


@dataclass(frozen=True)
class ModelShape:
    """What one token's arithmetic is made of (bench warm-floor)."""

    n_params: int
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    head_k: int
    head_v: int
    n_swa: int  # sliding window (positions); 0: every layer attends to all
    swa_layers: int  # layers that attend within the window only
