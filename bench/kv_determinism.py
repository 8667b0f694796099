"""How much a prompt's next-token logits move with how its KV was computed (docs/MEMORY.md,
"Reproducible greedy output"). In-process, the daemon's cache layout (swa_full, shadow ids).

    python -m uma_serve.bench.kv_determinism [--model PATH] [--threads N] [--flash F]
                                             [--deterministic]

Each case computes the same prompt on working sequence 0 and prints the max abs difference of
its last logits row from case (a) (cold, one chunk, empty cache) and whether the argmax moved.
With --deterministic, the runtime is umad --deterministic's (its matmul kernel, a lone token
decoded with a companion) and no decode holds more than DETERMINISTIC_BATCH tokens: each case
then runs in chunks of at most that many.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np

from uma_serve.core import config as cfg
from uma_serve.core.runtime import Runtime, Span
from uma_serve.core.runtime.params import RuntimeParams

N_SEQ, N_CACHE = 4, 8
TEXT = "The lighthouse keeper logs the weather every morning at six, and ships signal twice. "


CAP = [1 << 30]  # tokens per decode at most (--deterministic: DETERMINISTIC_BATCH)


def chunks(rt: Runtime, seq: int, tokens: list[int], start: int, size: int) -> np.ndarray:
    """Decode tokens[start:] on ``seq`` in chunks of ``size``; the last row's logits."""
    size = min(size, CAP[0])
    row = -1
    for pos in range(start, len(tokens), size):
        part = tokens[pos : pos + size]
        last = pos + len(part) == len(tokens)
        rc, rows = rt.decode([Span(seq, pos, part, last)])
        assert rc == 0, rc
        row = rows[0]
    return rt.logits_row(row).copy()


class Probe:
    """The runtime, the prompt every case computes on sequence 0 and another text's tokens;
    one method per way of computing the prompt's KV, each returning its last logits row."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.prompt = rt.tokenize(TEXT * 80)[:700]
        self.other = rt.tokenize("Once upon a time a cat sat on a mat and thought. " * 40)[:700]
        self.n = len(self.prompt)

    def clear(self) -> None:
        for s in range(N_SEQ + N_CACHE):
            self.rt.seq_clear(s)

    def run(self, setup: Callable[[], np.ndarray]) -> np.ndarray:
        self.clear()
        out = setup()
        self.clear()
        return out

    def cold(self, size: int) -> np.ndarray:
        return chunks(self.rt, 0, self.prompt, 0, size)

    def fixed(self, bounds: list[int]) -> np.ndarray:
        for a, b in zip(bounds, bounds[1:], strict=False):
            last = chunks(self.rt, 0, self.prompt[:b], a, b - a)
        return last

    def from_cache(self, k: int, size: int = 512) -> np.ndarray:
        chunks(self.rt, N_SEQ, self.prompt[:k], 0, size)  # a cache entry computed as a prompt
        self.rt.seq_copy(N_SEQ, 0, k)
        return chunks(self.rt, 0, self.prompt, k, 512)

    def decoded_tail(self, k: int, d: int) -> np.ndarray:
        """A cache entry whose last d positions were decoded one at a time (output tokens)."""
        rt, prompt = self.rt, self.prompt
        chunks(rt, N_SEQ, prompt[: k - d], 0, 512)
        for pos in range(k - d, k):
            rt.decode([Span(N_SEQ, pos, [prompt[pos]], True)])
        rt.seq_copy(N_SEQ, 0, k)
        return chunks(rt, 0, prompt, k, 512)

    def beside(self, m: int) -> np.ndarray:
        """The prompt's last part in one llama_decode with another sequence's m tokens."""
        rt, prompt, n = self.rt, self.prompt, self.n
        k = n - min(n - 512, CAP[0] - m)
        chunks(rt, 0, prompt[:k], 0, 512)
        rc, rows = rt.decode([Span(0, k, prompt[k:], True), Span(1, 0, self.other[:m], True)])
        assert rc == 0
        return rt.logits_row(rows[0]).copy()

    def occupied(self, m: int) -> np.ndarray:
        """Other cells resident first (a cache entry of m tokens), then the prompt cold."""
        chunks(self.rt, N_SEQ + 1, self.other[:m], 0, 512)
        return chunks(self.rt, 0, self.prompt, 0, 512)

    def fragmented(self) -> np.ndarray:
        """The prompt's cells out of position order: holes left by a freed sequence."""
        chunks(self.rt, 2, self.other[:300], 0, 512)
        chunks(self.rt, 3, self.other[:300], 0, 512)
        self.rt.seq_clear(2)  # a hole of 300 cells at the front
        return chunks(self.rt, 0, self.prompt, 0, 512)


def cases(pr: Probe) -> dict[str, Callable[[], np.ndarray]]:
    """The cases by name, in the order printed; case (a) is the reference."""
    n = pr.n
    out: dict[str, Callable[[], np.ndarray]] = {}
    out["a cold, 512 + 188"] = lambda: pr.cold(512)
    for size in (350, 100, 37, 1):
        out[f"b cold, chunks of {size}"] = lambda size=size: pr.cold(size)
    out["b cold, 512 + 187 + 1"] = lambda: pr.fixed([0, 512, n - 1, n])
    out["c cached 512 (as prompt, 512)"] = lambda: pr.from_cache(512)
    out["c cached 600 (as prompt, 512 + 88)"] = lambda: pr.from_cache(600)
    out["c cached 699 (as prompt, 512 + 187)"] = lambda: pr.from_cache(n - 1)
    out["c cached 699, last 100 decoded"] = lambda: pr.decoded_tail(n - 1, 100)
    out["d beside 1 token"] = lambda: pr.beside(1)
    out["d beside 30-token prompt"] = lambda: pr.beside(30)
    out["e cold after 169 resident cells"] = lambda: pr.occupied(169)
    out["e cold after 168 resident cells"] = lambda: pr.occupied(168)
    out["e cold into a 300-cell hole"] = pr.fragmented
    return out


def report(pr: Probe, named: dict[str, Callable[[], np.ndarray]]) -> None:
    """Case (a) twice, then every other case: its difference from (a), an argmax that moved."""
    ref = pr.run(named.pop("a cold, 512 + 188"))
    again = pr.run(lambda: pr.cold(512))
    print(f"prompt {pr.n} tokens; argmax {int(ref.argmax())}")
    print(f"{'a cold, 512 + 188, again':40s} max|d|={np.abs(again - ref).max():.5f}")
    for name, fn in named.items():
        got = pr.run(fn)
        d = np.abs(got - ref)
        flip = "" if got.argmax() == ref.argmax() else "  ARGMAX MOVED"
        print(f"{name:40s} max|d|={d.max():.5f} mean={d.mean():.6f}{flip}")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--flash", type=int, default=-1, help="-1 auto, 0 off, 1 on")
    ap.add_argument("--deterministic", action="store_true", help="umad --deterministic's shapes")
    return ap.parse_args()


def open_runtime(args: argparse.Namespace) -> Runtime:
    """The daemon's cache layout (swa_full, shadow ids) with N_SEQ + N_CACHE sequences."""
    return Runtime(
        RuntimeParams(
            model_path=args.model or cfg.default_model_path(),
            threads=args.threads,
            n_seq=N_SEQ,
            n_seq_cache=N_CACHE,
            swa_full=True,
            shadow=True,
            flash_attn=args.flash,
            deterministic=args.deterministic,
        )
    )


def main() -> None:
    args = parse_args()
    if args.deterministic:
        CAP[0] = cfg.DETERMINISTIC_BATCH
    probe = Probe(open_runtime(args))
    report(probe, cases(probe))
    probe.rt.close()


if __name__ == "__main__":
    main()
