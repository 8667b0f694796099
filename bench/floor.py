"""floor: a decode with nothing around it, the least a server on this llama.cpp takes a tick.

N sequences decode one token a tick, launched and synchronized in a loop with UMA Serve's
`Runtime` (no daemon, engine or socket), in forms that differ only in what follows a decode:
its outputs the device's top-k (what umad reads on a GPU), every logits row copied to the
host (what llama-batched-bench and a host sampler get), or none (the projection onto the
vocabulary skipped); or the device's top-k drawn by umad's `Sampler` as a request's defaults
ask (T = 0.8, top-k 40, top-p 0.95, min-p 0.05: what every bench scenario sends) or greedy,
each drawn token the sequence's next. The sampled forms are the least a server takes that
samples on the host, as every server on llama.cpp does: the next decode needs the tokens.
The `device` form draws inside the decode graph instead (each sequence's chain of llama.cpp's
backend samplers at the same settings, its token read back and fed to the next decode): what
a server drawing on the device would take.
The forms alternate, round by round. `ceiling` and `sweep` read against it: UMA Serve /
floor is the server's own cost, floor / ceiling llama.cpp's, the cache layout's and the draw's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

from uma_serve.bench import common

if TYPE_CHECKING:  # the runtime package loads llama.cpp: imported where it runs only
    from uma_serve.core.runtime import Runtime

FORMS = ("top-k", "rows", "none", "sampled", "greedy", "device")  # after a decode (docstring)
DRAWN = {"sampled": 0.8, "greedy": 0.0}  # the forms drawn on the host, at this temperature
PROMPT_TOKENS = 12  # each sequence's prompt: short, so that attention costs little
WARM_TICKS = 3  # untimed ticks after a form's switch (a graph reservation, a CUDA graph)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--levels", default="1,16", help="sequences decoding at once (default 1,16)")
    ap.add_argument("--ticks", type=int, default=150, help="timed ticks a round (default 150)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the forms")
    ap.add_argument("--top-k", type=int, default=64, help="the device's candidates a row")
    ap.add_argument("--n-ctx", type=int, default=32768)
    common.add_in_process(ap)


def run(args: argparse.Namespace) -> int:
    from uma_serve.core.config import default_model_path

    levels = [int(x) for x in args.levels.split(",")]
    need, per_seq = PROMPT_TOKENS + WARM_TICKS + args.ticks, args.n_ctx // max(levels)
    if per_seq < need:  # checked before the model loads
        raise SystemExit(f"floor: --n-ctx gives {per_seq} cells a sequence, {need} needed")
    model = args.model or default_model_path()
    rt = _open_runtime(args, model, max(levels))
    prompt = rt.tokenize("Once upon a time, in a land far away, there lived " * 2)[:PROMPT_TOKENS]
    ms: dict[int, dict[str, list[float]]] = {n: {f: [] for f in FORMS} for n in levels}
    for n in levels:
        for _ in range(args.rounds):
            for form in FORMS:
                ms[n][form].append(time_form(rt, n, form, prompt, args.ticks))
    rt.close()
    summary = _summary(args, model, ms)
    out = Path(args.out) / time.strftime("floor-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    _print_summary(summary, out)
    return 0


def _open_runtime(args: argparse.Namespace, model: str, n_seq: int) -> Runtime:
    from uma_serve.core.runtime import Runtime, RuntimeParams

    return Runtime(
        RuntimeParams(
            model,
            n_ctx=args.n_ctx,
            n_seq=n_seq,
            threads=args.threads,
            n_gpu_layers=args.n_gpu_layers,
            device_top_k=args.top_k,
            max_outputs_per_seq=1,
        )
    )


def tick(rt: Runtime, n: int, pos: int, form: str, tokens: list[int] | None = None) -> list[int]:
    """One token for each of sequences 0..n-1 at ``pos`` (``tokens``, else a fixed one each):
    launched and synchronized; the decode's output rows (-1 where it has none)."""
    from uma_serve.core.runtime import Span

    tokens = tokens or [PROMPT_TOKENS + s for s in range(n)]
    rows = rt.launch([Span(s, pos, [tokens[s]], form != "none") for s in range(n)])
    rc = rt.synchronize()
    assert rc == 0, rc
    return rows


class Draws:
    """A drawn form's host sampling: umad's Sampler, each sequence's state (a request's
    defaults at ``temperature``) and the tokens it drew last, the next decode's."""

    def __init__(self, rt: Runtime, n: int, temperature: float) -> None:
        from uma_serve.core import protocol as p
        from uma_serve.core.sampling import Row, Sampler

        self.sampler, self._row = Sampler(rt), Row  # imported here, not in the timed ticks
        req = p.Generate(id="floor", prompt="", temperature=temperature)
        self.states = [self.sampler.new(s, req, default_seed=s) for s in range(n)]
        self.sampler.apply()  # a --top-k under the request's 40: whole rows
        self.tokens = [PROMPT_TOKENS + s for s in range(n)]

    def draw(self, rows: list[int]) -> None:
        rows_ = [self._row(st, r) for st, r in zip(self.states, rows, strict=True)]
        picks = self.sampler.sample(rows_)
        self.tokens = [token for token, _ in picks]


class DeviceDraws:
    """The device form's draw: each sequence's device chain with the draw after its top-k
    (top-p, min-p and temperature at a request's defaults, a draw seeded by its id), all in
    the decode graph; each row's drawn token read back, the sequence's next. The next form's
    ``start_form`` gives every sequence its own chain back."""

    def __init__(self, rt: Runtime, n: int) -> None:
        from uma_serve.core import protocol as p
        from uma_serve.core.runtime.candidates import DeviceDraw

        self.rt = rt
        req = p.Sampling(temperature=DRAWN["sampled"])  # the sampled form's settings
        for s in range(n):  # the next decode reserves a graph
            draw = DeviceDraw(req.top_p, req.min_p, req.temperature, seed=s)
            rt.set_device_chain(s, req.top_k, draw)
        self.tokens = [PROMPT_TOKENS + s for s in range(n)]

    def draw(self, rows: list[int]) -> None:
        self.tokens = [self.rt.sampled_token(row) for row in rows]


def drawer(rt: Runtime, n: int, form: str) -> Draws | DeviceDraws | None:
    """What draws a form's tokens (after ``start_form``): None for the forms not drawn."""
    if form == "device":
        return DeviceDraws(rt, n)
    return Draws(rt, n, DRAWN[form]) if form in DRAWN else None


def start_form(rt: Runtime, n: int, form: str, prompt: list[int]) -> int:
    """Sequences 0..n-1 emptied, their device top-k on or off as ``form`` says, prompts
    prefilled (as many as a batch holds at once); the first position to decode at."""
    from uma_serve.core.runtime import Span

    top_k = rt.params.device_top_k if form in ("top-k", "device", *DRAWN) else 0
    for s in range(rt.params.n_seq):
        rt.set_device_chain(s, top_k)
    for s in range(n):
        rt.seq_clear(s)
    group = max(1, rt.n_batch // len(prompt))
    for first in range(0, n, group):
        rt.launch([Span(s, 0, prompt, True) for s in range(first, min(first + group, n))])
        assert rt.synchronize() == 0
    return len(prompt)


def time_form(rt: Runtime, n: int, form: str, prompt: list[int], ticks: int) -> float:
    """Milliseconds a tick of ``n`` sequences in ``form``, over ``ticks`` ticks."""
    pos = start_form(rt, n, form, prompt)
    draws = drawer(rt, n, form)
    t0 = time.perf_counter()
    for i in range(WARM_TICKS + ticks):
        if i == WARM_TICKS:
            t0 = time.perf_counter()
        rows = tick(rt, n, pos, form, None if draws is None else draws.tokens)
        if draws is not None:
            draws.draw(rows)
        pos += 1
    return (time.perf_counter() - t0) / ticks * 1e3


def _summary(args: argparse.Namespace, model: str, ms: dict[int, dict[str, list[float]]]) -> dict:
    """summary.json: each level's ms a tick per round and form, medians and tokens/s."""
    levels = {}
    for n, forms in ms.items():
        levels[str(n)] = {
            form: {"ms": t, "ms_p50": statistics.median(t), "tok_s": n * 1e3 / statistics.median(t)}
            for form, t in forms.items()
        }
    return {
        "meta": common.meta(args, "floor"),
        "model": Path(model).name,
        "n_gpu_layers": args.n_gpu_layers,
        "ticks": args.ticks,
        "rounds": args.rounds,
        "levels": levels,
    }


def _print_summary(s: dict, out: Path) -> None:
    print(f"floor: ms a tick (median of {s['rounds']} rounds)")
    print(f"{'sequences':>9}  " + "  ".join(f"{f:>16}" for f in FORMS))
    for n, forms in s["levels"].items():
        cells = [f"{forms[f]['ms_p50']:7.3f} ({forms[f]['tok_s']:6.0f}/s)" for f in FORMS]
        print(f"{n:>9}  " + "  ".join(cells))
    print(f"summary: {out / 'summary.json'}")
