"""What a loaded model says about itself: its GGUF metadata, read once at load, and the sizes
the policy (ΣBMT) and the bench (warm-floor) derive from it. No context, no decoding."""

from __future__ import annotations

import ctypes

import llama_cpp as ll

from uma_serve.core.policy.plan import ModelFacts
from uma_serve.core.runtime.params import ModelShape


class ModelInfo:
    def __init__(self, model: ll.llama_model_p) -> None:
        self._model = model
        self.name = self._meta("general.name")
        self.architecture = self._meta("general.architecture")
        raw = ll.llama_model_chat_template(model, None)
        self.chat_template = raw.decode("utf-8", "replace") if raw else None  # the GGUF's own

    def _meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = ll.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def _meta_int(self, key: str) -> int:
        value = self._meta(f"{self.architecture}.{key}")
        try:
            return int(value) if value else 0
        except ValueError:
            return 0

    def facts(self) -> ModelFacts:
        """Sizes the ΣBMT estimate needs: weight bytes, KV bytes per cell (f16 K+V, all
        layers), experts."""
        n_layer = self._meta_int("block_count")
        n_head_kv = self._meta_int("attention.head_count_kv") or 1
        k_len = self._meta_int("attention.key_length")
        v_len = self._meta_int("attention.value_length") or k_len
        return ModelFacts(
            weights_bytes=ll.llama_model_size(self._model),
            kv_bytes_per_cell=n_layer * n_head_kv * (k_len + v_len) * 2,
            n_expert=self._meta_int("expert_count"),
            n_expert_used=self._meta_int("expert_used_count"),
        )

    def shape(self) -> ModelShape:
        m = self._model
        n_layer, n_head = ll.llama_model_n_layer(m), ll.llama_model_n_head(m)
        n_embd, n_swa = ll.llama_model_n_embd(m), ll.llama_model_n_swa(m)
        head_k = self._meta_int("attention.key_length") or n_embd // n_head
        # llama.cpp's Gemma 3: every 6th layer attends to all, unless the GGUF says otherwise
        every = self._meta_int("attention.sliding_window_pattern") or 6
        swa = n_layer - n_layer // every if n_swa and self.architecture == "gemma3" else 0
        return ModelShape(
            n_params=ll.llama_model_n_params(m),
            n_vocab=ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(m)),
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            head_k=head_k,
            head_v=self._meta_int("attention.value_length") or head_k,
            n_swa=n_swa if swa else 0,
            swa_layers=swa,
        )
