"""grammar-mix: what a grammar constraint costs the unconstrained streams beside it.

Each round runs the same unconstrained streams four times: alone, beside a request asking
the same thing without a grammar ("plain", up to 120 tokens), beside the constrained request
(a JSON-schema grammar, as response_format builds it: "mixed"), and beside the plain request
again, each one as long as the constrained answer of the same seed ("matched"); the side
requests run one after another for as long as the streams last. Target: the streams' decode
tokens/s mixed >= 95% of plain (the median of the rounds' ratios): what the constraint
costs, apart from what any fourth request in the batch costs (``beside_over_alone``,
reported). A JSON answer is ~45 tokens against plain's 120, so a constrained request also
brings a new request (its prompt, a changed batch) three times as often: mixed / matched
is the constraint's cost without that. The constrained answers must parse.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics

from uma_serve.bench import common
from uma_serve.bench.report import RunDir
from uma_serve.bench.targets import RequestResult, RequestSpec, Target
from uma_serve.bench.workloads import Workload
from uma_serve.core.runtime.grammar import json_schema_gbnf

NAME = "grammar-mix"
KEY_METRICS = [
    ("mixed_over_plain", "higher"),
    ("mixed_over_matched", "higher"),
    ("plain_tok_per_s", "higher"),
]
PHASES = ("alone", "plain", "mixed", "matched")
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "temperature": {"type": "integer"},
        "notes": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["city", "unit", "temperature", "notes"],
    "additionalProperties": False,
}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    common.add_common(ap)
    ap.add_argument("--streams", type=int, default=3, help="unconstrained streams (default 3)")
    ap.add_argument("--max-tokens", type=int, help="tokens per stream (default 200, quick 48)")
    ap.add_argument("--rounds", type=int, help="plain/mixed pairs (default 3, quick 1)")


def _decode_tps(r: RequestResult) -> float | None:
    if not r.ok or len(r.token_ms) < 2 or r.token_ms[-1] <= r.token_ms[0]:
        return None
    return (r.n_tokens - 1) / ((r.token_ms[-1] - r.token_ms[0]) / 1e3)


async def _streams(
    target: Target,
    specs: list[RequestSpec],
    side_spec: RequestSpec | None,
    lengths: list[int] | None = None,
):
    """The streams' results, and the side requests' results run beside them (``lengths``:
    the i-th side request generates exactly ``lengths[i]`` tokens, cycling)."""
    done = asyncio.Event()
    side: list[RequestResult] = []

    async def beside() -> None:
        i = 0
        while not done.is_set():
            n = side_spec.max_tokens if not lengths else lengths[i % len(lengths)]
            spec = RequestSpec(
                side_spec.prompt, n, seed=side_spec.seed + i, ignore_eos=bool(lengths),
                grammar=side_spec.grammar, tag=side_spec.tag,
            )  # fmt: skip
            side.append(await target.generate(spec))
            i += 1

    task = asyncio.ensure_future(beside()) if side_spec is not None else None
    results = await asyncio.gather(*(target.generate(s) for s in specs))
    done.set()
    if task is not None:
        await task
    return list(results), side


async def measure(target: Target, args: argparse.Namespace, run: RunDir) -> dict:
    wl = Workload(args.seed)
    rounds = args.rounds or (1 if args.quick else 3)
    max_tokens = args.max_tokens or (48 if args.quick else 200)
    grammar = json_schema_gbnf(SCHEMA)
    ask = "Report the weather in Paris as JSON with city, unit, temperature and notes.\n"
    sides = {
        "alone": None,
        "plain": RequestSpec(ask, 120, seed=args.seed, tag="unconstrained"),
        "mixed": RequestSpec(ask, 120, seed=args.seed, grammar=grammar, tag="constrained"),
        "matched": RequestSpec(ask, 120, seed=args.seed, tag="matched"),
    }
    tps_of: dict[str, list[float]] = {phase: [] for phase in PHASES}
    ratios, matched, beside, side_all, failed = [], [], [], [], 0
    lengths_of: dict[str, list[int]] = {"constrained": [], "matched": []}
    for r in range(rounds):
        specs = [
            RequestSpec(wl.chat_prompt(40), max_tokens, seed=args.seed + 100 * r + i, tag=f"s{i}")
            for i in range(args.streams)
        ]
        per_phase, lengths = {}, []
        for phase in PHASES:
            matching = lengths if phase == "matched" else None
            results, side = await _streams(target, specs, sides[phase], matching)
            failed += sum(not x.ok for x in results) + sum(not x.ok for x in side)
            tps = [t for t in map(_decode_tps, results) if t]
            per_phase[phase] = statistics.mean(tps) if tps else 0.0
            tps_of[phase].append(per_phase[phase])
            if phase == "mixed":
                side_all += side
                lengths = [x.n_tokens for x in side if x.ok]
                lengths_of["constrained"] += lengths
            if phase == "matched":
                lengths_of["matched"] += [x.n_tokens for x in side if x.ok]
        if per_phase["plain"] and per_phase["alone"]:
            ratios.append(per_phase["mixed"] / per_phase["plain"])
            beside.append(per_phase["plain"] / per_phase["alone"])
        if per_phase["matched"]:
            matched.append(per_phase["mixed"] / per_phase["matched"])
    return {
        "rounds": rounds,
        "streams": args.streams,
        "max_tokens": max_tokens,
        "alone_tok_per_s": statistics.median(tps_of["alone"]),
        "plain_tok_per_s": statistics.median(tps_of["plain"]),
        "mixed_tok_per_s": statistics.median(tps_of["mixed"]),
        "matched_tok_per_s": statistics.median(tps_of["matched"]),
        "mixed_over_plain": statistics.median(ratios) if ratios else None,
        "ratios": ratios,
        "mixed_over_matched": statistics.median(matched) if matched else None,
        "matched_ratios": matched,
        "side_lengths": lengths_of,  # the side requests' tokens: matched repeats constrained
        "beside_over_alone": statistics.median(beside) if beside else None,
        **_constrained(side_all, failed),
    }


def _constrained(side_all: list[RequestResult], failed: int) -> dict:
    """The constrained answers: how many completed and parse (a grammar-complete answer must;
    one cut by max_tokens need not), their decode speed, and all failures counted."""
    complete = [x for x in side_all if x.ok and x.finish_reason == "stop"]
    parsed = 0
    for x in complete:
        with contextlib.suppress(ValueError):
            parsed += isinstance(json.loads("".join(x.texts)), dict)
    side_tps = [t for t in map(_decode_tps, side_all) if t]
    return {
        "constrained_requests": len(side_all),
        "constrained_complete": len(complete),
        "constrained_parsed": parsed,
        "constrained_tok_per_s": statistics.median(side_tps) if side_tps else None,
        "failed": failed + len(complete) - parsed,
        "errors": common.errors([*side_all]),
    }


def run(args: argparse.Namespace) -> int:
    import sys

    return common.run_scenario(args, sys.modules[__name__])
