"""Everything llama.cpp: the only package that imports ``llama_cpp``.

``runtime``: model, context, batch, decode, KV memory ops, tokenizer; ``model_info``: what the
model's GGUF says (name, architecture, chat template, the sizes derived from it); ``grammar``: a
request's GBNF grammar; ``params``: the
plain data they are built from.
"""

from uma_serve.core.runtime.params import RuntimeParams, Span
from uma_serve.core.runtime.runtime import Runtime, gpu_offload

__all__ = ["Runtime", "RuntimeParams", "Span", "gpu_offload"]
