"""synth-model: write a GGUF with a real model's shapes and random weights, for measuring
serving at real sizes (throughput and latency do not depend on the weights' values).

The tokenizer (and its metadata) is copied from a given GGUF (default: the embedded Gemma 3
270M), so every shape uses Gemma's 262,144-token vocabulary: the embedding and output matrices
of the Llama and Qwen shapes are larger than the originals'. Weights are written already
quantized, as random Q4_K blocks (Q8_0 where a row's length is not a multiple of 256) with
small fixed scales, and norms at 1.0: a model of any size is written in seconds, without a
float copy. llama.cpp's Q4_K_M keeps a few tensors at Q6_K; these files are Q4_K throughout.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ARCH_KEYS = ("context_length", "embedding_length", "block_count", "feed_forward_length")


@dataclass(frozen=True)
class Shape:
    arch: str  # llama.cpp architecture name
    hidden: int
    layers: int
    ffn: int  # dense FFN width, or each expert's width for an MoE
    heads: int
    kv_heads: int
    head_dim: int
    experts: int = 0
    experts_used: int = 0
    rope_base: float = 1e6
    tied: bool = True  # the output matrix is the embedding's


SHAPES: dict[str, Shape] = {
    "gemma3-1b": Shape("gemma3", 1152, 26, 6912, 4, 1, 256),
    "gemma3-4b": Shape("gemma3", 2560, 34, 10240, 8, 4, 256),
    "gemma3-12b": Shape("gemma3", 3840, 48, 15360, 16, 8, 256),
    "llama3.2-1b": Shape("llama", 2048, 16, 8192, 32, 8, 64, rope_base=5e5),
    "llama3.1-8b": Shape("llama", 4096, 32, 14336, 32, 8, 128, rope_base=5e5, tied=False),
    "qwen3-30b-a3b": Shape("qwen3moe", 2048, 48, 768, 32, 4, 128, 128, 8, tied=False),
    "olmoe-1b-7b": Shape("olmoe", 2048, 16, 1024, 16, 16, 128, 64, 8, tied=False),
}
NAME = "synth-model"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out", required=True, help="the GGUF to write")
    ap.add_argument("--tokenizer", help="GGUF whose tokenizer to copy (default: embedded Gemma)")
    ap.add_argument("--layers", type=int, help="fewer layers (a quick test)")
    ap.add_argument("--seed", type=int, default=0)


def tensors(s: Shape, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy-order shape) of every tensor of the architecture."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    out = [("token_embd.weight", (vocab, s.hidden)), ("output_norm.weight", (s.hidden,))]
    if not s.tied:
        out.append(("output.weight", (vocab, s.hidden)))
    for b in range(s.layers):
        p = f"blk.{b}."
        out += [
            (p + "attn_norm.weight", (s.hidden,)),
            (p + "attn_q.weight", (q, s.hidden)),
            (p + "attn_k.weight", (kv, s.hidden)),
            (p + "attn_v.weight", (kv, s.hidden)),
            (p + "attn_output.weight", (s.hidden, q)),
            (p + "ffn_norm.weight", (s.hidden,)),
        ]
        if s.arch in ("gemma3", "qwen3moe"):
            out += [(p + f"attn_{x}_norm.weight", (s.head_dim,)) for x in "qk"]
        if s.arch == "olmoe":
            out += [(p + "attn_q_norm.weight", (q,)), (p + "attn_k_norm.weight", (kv,))]
        if s.arch == "gemma3":
            out += [(p + f"post_{x}_norm.weight", (s.hidden,)) for x in ("attention", "ffw")]
        if s.experts:
            e = s.experts
            out += [
                (p + "ffn_gate_inp.weight", (e, s.hidden)),
                (p + "ffn_gate_exps.weight", (e, s.ffn, s.hidden)),
                (p + "ffn_up_exps.weight", (e, s.ffn, s.hidden)),
                (p + "ffn_down_exps.weight", (e, s.hidden, s.ffn)),
            ]
        else:
            out += [
                (p + "ffn_gate.weight", (s.ffn, s.hidden)),
                (p + "ffn_up.weight", (s.ffn, s.hidden)),
                (p + "ffn_down.weight", (s.hidden, s.ffn)),
            ]
    return out


def random_blocks(shape: tuple[int, ...], rng: np.random.Generator):  # -> (array, type)
    """Random quantized rows with small valid scales: Q4_K where the row length allows."""
    import gguf

    q4k, q8 = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q8_0
    qtype = q4k if shape[-1] % 256 == 0 else q8
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows = int(np.prod(shape[:-1]))
    n = rows * (shape[-1] // block) * size
    data = np.frombuffer(rng.bytes(n), np.uint8).reshape(rows, shape[-1] // block, size).copy()
    scale = np.frombuffer(np.float16(2**-10).tobytes(), np.uint8)
    data[:, :, 0:2] = scale  # d (and dmin below): finite, small
    if qtype is q4k:
        data[:, :, 2:4] = scale
    return data.reshape(*shape[:-1], shape[-1] // block * size), qtype


def write(shape: Shape, out: Path, tokenizer: Path, seed: int = 0) -> None:
    import gguf

    src = gguf.GGUFReader(str(tokenizer))
    vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    w = gguf.GGUFWriter(str(out), shape.arch)
    _metadata(w, shape, src)
    rng = np.random.default_rng(seed)
    for name, dims in tensors(shape, vocab):
        if len(dims) == 1:
            w.add_tensor(name, np.ones(dims, np.float32))
        elif name.endswith("ffn_gate_inp.weight"):  # the router: float, random routes
            w.add_tensor(name, rng.standard_normal(dims, np.float32) * 0.02)
        else:
            data, qtype = random_blocks(dims, rng)
            w.add_tensor(name, data, raw_dtype=qtype)  # its shape from the bytes' shape
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _metadata(w, s: Shape, src) -> None:  # noqa: ANN001 (gguf's writer and reader)
    import gguf

    a = s.arch
    w.add_name(f"synthetic {a} {s.hidden}x{s.layers}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    for key, val in zip(ARCH_KEYS, (32768, s.hidden, s.layers, s.ffn), strict=True):
        w.add_uint32(f"{a}.{key}", val)
    w.add_uint32(f"{a}.attention.head_count", s.heads)
    w.add_uint32(f"{a}.attention.head_count_kv", s.kv_heads)
    w.add_uint32(f"{a}.attention.key_length", s.head_dim)
    w.add_uint32(f"{a}.attention.value_length", s.head_dim)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{a}.rope.freq_base", s.rope_base)
    if a == "gemma3":
        w.add_uint32(f"{a}.attention.sliding_window", 1024)
    if s.experts:
        w.add_uint32(f"{a}.expert_count", s.experts)
        w.add_uint32(f"{a}.expert_used_count", s.experts_used)
        w.add_uint32(f"{a}.expert_feed_forward_length", s.ffn)
    for name, field in src.fields.items():
        if name.startswith("tokenizer."):
            _copy_field(w, name, field)


def _copy_field(w, name: str, field) -> None:  # noqa: ANN001
    import gguf

    t = field.types[0]
    if t == gguf.GGUFValueType.ARRAY:
        sub = field.types[-1]
        if sub == gguf.GGUFValueType.STRING:
            vals = [bytes(field.parts[i]) for i in field.data]
        else:
            vals = [field.parts[i][0].item() for i in field.data]
        w.add_array(name, vals)
    elif t == gguf.GGUFValueType.STRING:
        w.add_string(name, bytes(field.parts[field.data[0]]).decode())
    else:
        w.add_key_value(name, field.parts[field.data[0]][0].item(), t)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from uma_serve.core.config import default_model_path

    shape = SHAPES[args.shape]
    if args.layers:
        shape = replace(shape, layers=args.layers)
    write(shape, Path(args.out), Path(args.tokenizer or default_model_path()), args.seed)
    print(f"{args.out}: {Path(args.out).stat().st_size / 2**30:.2f} GiB ({args.shape})")
    return 0
