"""llama.cpp's own sampler chain: the oracle the tests hold the engine's sampler against."""

from __future__ import annotations

import llama_cpp as ll

from uma_serve.core.protocol import Sampling
from uma_serve.core.sampling import PENALTY_LAST_N


class LlamaChain:
    """llama.cpp's chain for one sequence (as llama.cpp's common sampler builds it); frees
    itself."""

    def __init__(self, vocab_size: int, params: Sampling, default_seed: int) -> None:
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        add = lambda s: ll.llama_sampler_chain_add(chain, s)  # noqa: E731
        if params.logit_bias:  # first, as llama.cpp's common sampler puts it
            pairs = params.logit_bias.items()
            biases = (ll.llama_logit_bias * len(pairs))(*pairs)
            add(ll.llama_sampler_init_logit_bias(vocab_size, len(biases), biases))
        if (
            params.repeat_penalty != 1.0
            or params.frequency_penalty != 0.0
            or params.presence_penalty != 0.0
        ):
            add(
                ll.llama_sampler_init_penalties(
                    vocab_size,
                    PENALTY_LAST_N,
                    params.repeat_penalty,
                    params.frequency_penalty,
                    params.presence_penalty,
                )
            )
        if params.temperature <= 0.0:
            add(ll.llama_sampler_init_greedy())
        else:
            if params.top_k > 0:
                add(ll.llama_sampler_init_top_k(params.top_k))
            if params.top_p < 1.0:
                add(ll.llama_sampler_init_top_p(params.top_p, 1))
            if params.min_p > 0.0:
                add(ll.llama_sampler_init_min_p(params.min_p, 1))
            add(ll.llama_sampler_init_temp(params.temperature))
            seed = params.seed if params.seed is not None else default_seed
            add(ll.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        self._chain = chain

    def sample(self, ctx: ll.llama_context_p, batch_index: int) -> int:
        return ll.llama_sampler_sample(self._chain, ctx, batch_index)

    def free(self) -> None:
        if self._chain is not None:
            ll.llama_sampler_free(self._chain)
            self._chain = None

    def __del__(self) -> None:
        self.free()
