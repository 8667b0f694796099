"""The model and its context: decode (abortable from another thread; on a launch thread of
its own where it has one, launcher.py) from its batch (batch.py), logits rows,
tokenize/detokenize, chat template; its KV memory operations: kv_memory.py."""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path
from typing import Any

import llama_cpp as ll
import numpy as np

from uma_serve.core.runtime.batch import DecodeBatch
from uma_serve.core.runtime.candidates import DeviceCandidates, DeviceDraw, chain_for, top_k_chain
from uma_serve.core.runtime.gil import held
from uma_serve.core.runtime.grammar import FirstChars, Grammar
from uma_serve.core.runtime.kv_memory import KvMemory, landed
from uma_serve.core.runtime.launcher import Launcher
from uma_serve.core.runtime.model_info import ModelInfo
from uma_serve.core.runtime.params import RuntimeParams, Span, shadows_needed

# ggml's CPU backend: "0" sends every K-quant matmul through the per-row kernel
DETERMINISTIC_ENV = ("GGML_CPU_TILED_MM", "0")
WARM_UP_TOKENS = 64  # a prompt-sized batch: the multi-token kernels load too
# llama.cpp's standard sliding window: a cell leaves it n_swa positions on (shadow tags lag)
STANDARD_SWA = frozenset({"gemma2", "gemma3", "gemma3n", "cohere2"})
_logits_ith = held(ll.llama_get_logits_ith)  # read after the tick's synchronize (gil.py)
_perf = held(ll.llama_perf_context)

log = logging.getLogger("uma.runtime")

# ggml log levels (1 debug, 2 info, 3 warn, 4 error, 5 continuation); llama's info is chatty.
_LOG_LEVELS = {3: logging.WARNING, 4: logging.ERROR}
_llama_log = logging.getLogger("uma.llama")


# Abort flags of the live runtimes: while one is raised, llama.cpp's complaints about the
# aborted graph are expected and logged at debug level only.
_abort_flags: list[ctypes.Array] = []


@ll.llama_log_callback
def _log_callback(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    msg = text.decode("utf-8", "replace").rstrip()
    if msg:
        aborting = any(flag.value for flag in _abort_flags)
        level = logging.DEBUG if aborting else _LOG_LEVELS.get(level, logging.DEBUG)
        _llama_log.log(level, "%s", msg)


ll.llama_log_set(_log_callback, ctypes.c_void_p(0))

# llama.cpp asks ``abort_callback(data)`` between the nodes of a running graph. The callback is
# libc's strlen over a two-byte flag (b"\x01\x00" -> 1: abort, b"\x00\x00" -> 0): plain C,
# so nothing in Python (and no GIL) runs inside a decode, and another thread stops one by
# writing one byte.
_STRLEN_ABORT = ll.ggml_abort_callback(ctypes.cast(ctypes.CDLL(None).strlen, ctypes.c_void_p).value)

# ggml's log sink once a context exists: libc's abs (it reads the level, returns, ignores the
# rest). The CUDA backend logs a debug line on every decode ("CUDA Graph id .. reused"); through
# the Python callback each one would take the GIL inside llama_decode, behind the I/O thread.
_SILENT_LOG = ll.llama_log_callback(ctypes.cast(ctypes.CDLL(None).abs, ctypes.c_void_p).value)
_ggml_log_set = ll.llama_cpp._lib.ggml_log_set  # libggml-base's, through libllama's handle
_ggml_log_set.argtypes, _ggml_log_set.restype = [ll.llama_log_callback, ctypes.c_void_p], None


SPLIT_MODES = {
    "none": ll.LLAMA_SPLIT_MODE_NONE,
    "layer": ll.LLAMA_SPLIT_MODE_LAYER,
    "row": ll.LLAMA_SPLIT_MODE_ROW,
}


def gpu_offload(n_gpu_layers: int) -> bool:
    """Whether layers will run on a GPU (a GPU build and layers asked for)."""
    return n_gpu_layers != 0 and bool(ll.llama_supports_gpu_offload())


class Runtime(KvMemory):
    """One model, one context, one batch. Not thread-safe: the engine thread drives decode;
    tokenize/detokenize only read the vocab and may run on another thread."""

    def __init__(self, params: RuntimeParams, model_of: Runtime | None = None) -> None:
        """``model_of``: a runtime whose loaded model this one's context shares (another
        context of the same weights; that runtime frees the model, after this one)."""
        self.params = params
        path = Path(params.model_path)
        if not path.is_file():
            raise FileNotFoundError(f"model file not found: {path}")
        ll.llama_backend_init()
        self._owns_model = model_of is None
        self.model = self._load_model(path, params) if model_of is None else model_of.model
        params = self.params = shadows_needed(params, ll.llama_model_n_swa(self.model))
        cparams = self._context_params(params)
        self.ctx = ll.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            if self._owns_model:
                ll.llama_model_free(self.model)
            raise RuntimeError("llama.cpp could not create a context (n_ctx too large?)")
        _abort_flags.append(self._abort)
        # start-up's messages are logged; past it ggml's only at debug level (llama.cpp's always)
        debug = _llama_log.isEnabledFor(logging.DEBUG)
        _ggml_log_set(_log_callback if debug else _SILENT_LOG, None)
        self.vocab = ll.llama_model_get_vocab(self.model)
        self.memory = ll.llama_get_memory(self.ctx)
        self.n_ctx = ll.llama_n_ctx(self.ctx)
        self.n_batch = params.n_batch
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_per_seq = self.n_ctx // params.n_seq
        self.info = ModelInfo(self.model)  # metadata, the policy's facts, the bench's shape
        self.model_name = self.info.name or path.stem
        self.model_path = str(path)
        self.threads = cparams.n_threads
        self._batch = DecodeBatch(params.n_batch, self._pad_id)
        self._launcher = Launcher() if params.launch_thread else None
        self._pending: tuple[list[Span], bool] | None = None  # a launch not yet returned
        self._rc = 0
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._shadow_lag = self._shadow_lag_for(params)
        self._shadowed = [0] * self._n_ids  # positions [0, n) of each id carry its shadow
        self._clean: set[int] = set()  # none known empty until cleared (kv_memory.py)
        self._candidates = DeviceCandidates(params.device_top_k, self.n_vocab)
        self.first_chars: FirstChars | None = None  # a grammar's table (grammar.py)
        log.info("loaded %s: n_ctx=%d (%d per sequence) n_seq=%d n_batch=%d threads=%d",
                 self.model_name, self.n_ctx, self.n_ctx_per_seq, params.n_seq, params.n_batch,
                 self.threads)  # fmt: skip

    def _load_model(self, path: Path, params: RuntimeParams) -> ll.llama_model_p:
        mparams = ll.llama_model_default_params()
        mparams.n_gpu_layers = params.n_gpu_layers
        self._set_split(mparams, params)
        mparams.use_extra_bufts = False  # AMX/repacked weights crash llama_decode on these CPUs
        model = ll.llama_model_load_from_file(str(path).encode(), mparams)
        if not model:
            raise RuntimeError(f"llama.cpp could not load the model {path}")
        return model

    def _context_params(self, params: RuntimeParams) -> Any:
        """llama.cpp's context parameters; sets the ids, the device top-k chains and the abort
        flag the context is created with."""
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = params.n_ctx
        cparams.n_batch = params.n_batch
        cparams.n_ubatch = min(params.n_ubatch, params.n_batch)
        self._n_ids = params.n_seq + params.n_seq_cache
        cparams.n_seq_max = self._n_ids * (2 if params.shadow else 1)
        # deterministic: the lone token's companion lives on the last id, for one decode
        self._pad_id = cparams.n_seq_max if params.deterministic else -1
        if params.deterministic:
            cparams.n_seq_max += 1
            # read once, at the process's first matmul: K-quant matmuls through the per-row
            # kernel at every batch size (the tiled kernel, used from 8 rows up, rounds
            # differently)
            os.environ[DETERMINISTIC_ENV[0]] = DETERMINISTIC_ENV[1]
        threads = params.threads if params.threads > 0 else (os.cpu_count() or 1)
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.swa_full = params.swa_full
        cparams.kv_unified = params.kv_unified
        cparams.no_perf = True
        cparams.flash_attn_type = params.flash_attn
        cparams.n_outputs_max_per_seq = params.max_outputs_per_seq
        # each sequence's device chain (a top-k; a whole-row chain while detached), attached
        # at creation (one graph reservation for good, not one per request)
        self._seq_chains = [top_k_chain(params.device_top_k) for _ in range(params.n_seq)]
        if params.device_top_k > 0:
            self._sampler_configs = (ll.llama_sampler_seq_config * params.n_seq)()
            for seq_id, chain in enumerate(self._seq_chains):
                self._sampler_configs[seq_id].seq_id = seq_id
                self._sampler_configs[seq_id].sampler = ctypes.cast(chain, ctypes.c_void_p)
            cparams.samplers, cparams.n_samplers = self._sampler_configs, params.n_seq
        self._abort = ctypes.create_string_buffer(2)
        cparams.abort_callback = _STRLEN_ABORT
        cparams.abort_callback_data = ctypes.cast(self._abort, ctypes.c_void_p)
        return cparams

    def _shadow_lag_for(self, params: RuntimeParams) -> int:
        """How many decoded positions a sequence's shadow tag may trail by. Each tag is a
        ``seq_cp``, a pass over every KV cell (0.7 ms a 16-stream tick at 32k cells), so with
        a standard window the tags are added every ``lag`` positions: a cell is recycled only
        once n_swa positions lie after it. Other windows: every decode; no shadows: never."""
        if not params.shadow:
            return 1 << 30
        n_swa = ll.llama_model_n_swa(self.model)
        if self.info.architecture not in STANDARD_SWA:
            return 1
        # within one decode the sequence may run n_batch - n_ubatch past its last tags
        return max(1, min(256, (n_swa - (params.n_batch - params.n_ubatch)) // 2))

    # ---- text ----

    def tokenize(self, text: str, add_special: bool = True, special: bool = True) -> list[int]:
        """``special``: control-token texts (e.g. "<end_of_turn>") become those tokens; off
        for text a user wrote inside a chat message."""
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (ll.llama_token * cap)()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, special)
        if n < 0:
            cap = -n
            buf = (ll.llama_token * cap)()
            n = ll.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, special)
        return list(buf[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token (may be part of a UTF-8 character); cached. ``special``:
        control tokens render as their text (else as nothing); not cached."""
        cached = None if special else self._pieces.get(token)
        if cached is None:
            buf = ctypes.create_string_buffer(64)
            n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
            cached = buf.raw[:n]
            if not special:
                self._pieces[token] = cached
        return cached

    def is_eog(self, token: int) -> bool:
        eog = self._eog.get(token)  # asked for every token: a dict keeps the GIL (gil.py)
        if eog is None:
            eog = self._eog[token] = bool(ll.llama_vocab_is_eog(self.vocab, token))
        return eog

    @property
    def eog_tokens(self) -> tuple[int, ...]:
        """The vocabulary's end-of-generation tokens that have an id (EOS, EOT)."""
        ids = {ll.llama_vocab_eos(self.vocab), ll.llama_vocab_eot(self.vocab)}
        return tuple(sorted(t for t in ids if t >= 0 and self.is_eog(t)))

    # ---- decode ----

    def decode(self, spans: list[Span]) -> tuple[int, list[int]]:
        """Fill the batch from spans and run one llama_decode, here.

        Returns (rc, batch index of each span's logits row or -1). rc 0 is success; rc 1
        means no KV slot for this batch: the caller shrinks the next one (a soft failure);
        rc 2 means ``abort`` stopped it (llama.cpp took the batch's cells back).
        A span with ``all_logits`` has logits on every token; its entry is the first row (the
        rows of its tokens are consecutive).
        """
        self._landed()
        rows, padded = self._fill(spans)
        self._land(ll.llama_decode(self.ctx, self._batch.batch), spans, padded)
        return self._rc, rows

    def launch(self, spans: list[Span], on_thread: bool = False) -> list[int]:
        """``decode``'s start, its rc left to ``synchronize``. ``on_thread``: on the runtime's
        launch thread where it has one (llama_decode releases the GIL: the engine thread's
        Python work overlaps llama_decode's own host work, the batch and the attention mask),
        else here. Every later call on the context first waits for it to return."""
        if self._launcher is None or not on_thread:
            return self.decode(spans)[1]
        self._landed()
        rows, padded = self._fill(spans)
        self._launcher.start(self.ctx, self._batch.batch)
        self._pending = spans, padded
        return rows

    def _fill(self, spans: list[Span]) -> tuple[list[int], bool]:
        self._clean.difference_update([span.seq_id for span in spans])  # they will hold cells
        return self._batch.fill(spans)

    def _land(self, rc: int, spans: list[Span], padded: bool) -> None:
        """What follows a llama_decode's return: the pad's cell dropped, shadows tagged."""
        if padded:
            ll.llama_memory_seq_rm(self.memory, self._batch.pad_id, -1, -1)
        if rc == 0 and self.params.shadow:
            for span in spans:
                self._tag_shadow(span.seq_id, span.pos + len(span.tokens))
        self._rc = rc

    def _landed(self) -> int:
        """Wait for a launch on the launch thread to return (not for the device: that is
        ``synchronize``); the last decode's rc."""
        if self._pending is not None:
            spans, padded = self._pending
            self._pending = None
            assert self._launcher is not None
            self._land(self._launcher.result(), spans, padded)
        return self._rc

    def _tag_shadow(self, seq_id: int, end: int) -> None:
        start = self._shadowed[seq_id]
        if end - start >= self._shadow_lag:
            ll.llama_memory_seq_cp(self.memory, seq_id, seq_id + self._n_ids, start, end)
            self._shadowed[seq_id] = end

    @landed
    def warm_up(self) -> None:
        """A prompt-shaped and a decode-shaped batch on sequence 0, then an empty cache, like
        llama-server's start-up warm-up run: the first request then does not pay for the lazy
        work of a fresh process (weights paged in, GPU kernels loaded, buffers allocated).
        Start-up only: it clears the whole KV cache."""
        tokens = self.tokenize("The quick brown fox jumps over the lazy dog. " * 8)
        tokens = tokens[: min(WARM_UP_TOKENS, self.params.n_batch)]
        ll.llama_memory_clear(self.memory, True)
        for span in (Span(0, 0, tokens, True), Span(0, len(tokens), tokens[-1:], True)):
            rc, _ = self.decode([span])
            self.synchronize()
            if rc != 0:
                log.warning("warm-up decode returned %d", rc)
                break
        ll.llama_memory_clear(self.memory, True)

    def synchronize(self) -> int:
        """Wait for the last launch and the device: llama_decode returns once a GPU graph is
        launched, so a tick's time is only known (and its logits readable) after this. The
        launch's rc (``decode``'s)."""
        rc = self._landed()
        ll.llama_synchronize(self.ctx)
        return rc

    def abort(self) -> None:
        """Stop the running decode (any thread): it returns rc 2 within one graph node."""
        self._abort[0] = b"\x01"

    def clear_abort(self) -> None:
        self._abort[0] = b"\x00"

    @landed
    def logits_row(self, row: int) -> np.ndarray:
        """The logits of a batch row as a numpy view on llama.cpp's buffer (no copy); valid
        until the next decode."""
        ptr = _logits_ith(self.ctx, row)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def _set_split(self, mparams: Any, params: RuntimeParams) -> None:
        """llama.cpp's own split of a model over several GPUs (ignored by a CPU build)."""
        mparams.split_mode = SPLIT_MODES[params.split_mode]
        mparams.main_gpu = params.main_gpu
        if not params.tensor_split:
            return
        n = int(ll.llama_max_devices())
        if len(params.tensor_split) > n:
            raise ValueError(f"tensor_split gives {len(params.tensor_split)} shares; this build "
                             f"of llama.cpp takes {n} devices at most")  # fmt: skip
        # llama.cpp reads the array during the load: it lives as long as the runtime
        self._tensor_split = (ctypes.c_float * n)(*params.tensor_split)
        mparams.tensor_split = self._tensor_split

    @landed
    def candidates(self, rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The device top-k of batch rows as (rows, k) arrays of token ids and their logits,
        unsorted, padded with logit -inf (core/runtime/candidates.py): valid until the next
        call."""
        return self._candidates.read(self.ctx, rows, self._batch)

    @landed
    def graph_reuses(self) -> int:
        """Decodes so far that reused the graph of the one before (llama.cpp's count, kept with
        ``no_perf`` too): a GPU replays its CUDA graph only in those (docs/GPU.md)."""
        return int(_perf(self.ctx).n_reused)

    @landed
    def wide_candidates(self, row: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The device top-k of a row whose chain hands over ``k`` (however wide), copied."""
        return self._candidates.read_all(self.ctx, row, k, self._batch)

    @landed
    def set_device_chain(self, seq_id: int, k: int, draw: DeviceDraw | None = None) -> None:
        """A sequence's device chain: a top-k of ``k``, 0 its whole row (``draw``: and the draw
        after it, its token read with ``sampled_token``); a change costs a graph reservation at
        the next decode, and is a new chain (llama.cpp sets one up for good)."""
        old = self._seq_chains[seq_id]
        chain = self._seq_chains[seq_id] = chain_for(min(k, self.n_vocab), draw)
        ll.llama_set_sampler(self.ctx, seq_id, chain)
        if old is not None:
            ll.llama_sampler_free(old)

    @landed
    def sampled_token(self, row: int) -> int:
        """The token a batch row's device chain drew (``set_device_chain``'s ``draw``)."""
        return int(ll.llama_get_sampled_token_ith(self.ctx, row))

    def grammar(self, text: str) -> Grammar:
        if self.first_chars is None:  # umad builds it at start-up, once for every context
            self.first_chars = FirstChars(self.vocab)
        return Grammar(self.vocab, text, self.eog_tokens, self.first_chars)

    def close(self) -> None:
        if getattr(self, "ctx", None):
            self._landed()
            if self._launcher is not None:
                self._launcher.close()
            self._batch.free()
            ll.llama_free(self.ctx)
            for chain in filter(None, self._seq_chains):
                ll.llama_sampler_free(chain)
            if self._owns_model:
                ll.llama_model_free(self.model)
            self.ctx = None
            if self._abort in _abort_flags:
                _abort_flags.remove(self._abort)
