"""repetitive: one greedy stream asked to rewrite a given text; speculative decoding on vs off.

Prompt-lookup drafting proposes the continuation of the text being copied, so most drafted
tokens are accepted. Target: decode tokens/s with speculation >= 1.5x without, identical text
(bit-identical with `--umad-arg=--deterministic --umad-arg=on`; by default a verification
batch's shape takes other CPU kernels, whose rounding may turn a near-tie: reported, not
failed).
For a started server (uma, uma-socket) the scenario runs umad twice, with `--spec-draft 0` and
as configured; against --socket/--url or a peer it measures the one server as it is.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from uma_serve.bench import common
from uma_serve.bench.report import RunDir
from uma_serve.bench.servers import ServerUnavailable
from uma_serve.bench.targets import RequestResult, RequestSpec, Target

NAME = "repetitive"
KEY_METRICS = [("decode_tok_per_s", "higher"), ("ttft_p50_ms", "lower")]

TEXT = (
    "The museum opens at nine in the morning and closes at six in the evening. Tickets can be "
    "bought at the entrance or online, and children under twelve enter for free. The east wing "
    "holds paintings from the northern coast, most of them painted by fishermen who learned to "
    "paint in the long winters. The west wing shows tools, boats and nets, with a small room "
    "about the lighthouse and its keepers. Guided tours start every hour from the main hall and "
    "last about forty minutes. The cafe on the first floor serves soup, bread and fish, and the "
    "shop sells books about the region, postcards and copies of the paintings. "
)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    common.add_common(ap)
    ap.add_argument("--requests", type=int, help="sequential requests (default 3, quick 1)")
    ap.add_argument("--max-tokens", type=int, help="tokens per answer (default 160, quick 48)")


def prompt(i: int, seed: int) -> str:
    task = ("Rewrite", "Repeat", "Copy")[i % 3]
    text = TEXT * 2
    return f"Note {seed}-{i}. {task} the following text exactly.\n\nText: {text}\n\n{task}:"


async def core_metrics(target: Target) -> dict | None:
    """The core's metrics snapshot when the target is umad's socket (None otherwise)."""
    get = getattr(target, "_get", None)
    if get is None:
        return None
    try:
        return await (await get()).metrics()
    except Exception:  # noqa: BLE001 - a peer or an old core: no figures
        return None


def _decode_tps(r: RequestResult) -> float | None:
    if not r.ok or len(r.token_ms) < 2 or r.token_ms[-1] <= r.token_ms[0]:
        return None
    return (r.n_tokens - 1) / ((r.token_ms[-1] - r.token_ms[0]) / 1e3)


async def measure(target: Target, args: argparse.Namespace, run: RunDir) -> dict:
    n = args.requests or (1 if args.quick else 3)
    max_tokens = args.max_tokens or (48 if args.quick else 160)
    specs = [
        RequestSpec(prompt(i, args.seed), max_tokens, temperature=0.0, tag=f"r{i}")
        for i in range(n)
    ]
    results, dt = await common.run_concurrent(target, specs, 1, "repetitive")
    m = await core_metrics(target) or {}
    tps = [t for t in map(_decode_tps, results) if t]
    ttft = [r.token_ms[0] for r in results if r.ok and r.token_ms]
    return {
        "requests": n,
        "max_tokens": max_tokens,
        "decode_tok_per_s": statistics.median(tps) if tps else None,
        "ttft_p50_ms": statistics.median(ttft) if ttft else None,
        "spec_drafted_tokens": m.get("spec_drafted_tokens_total"),
        "spec_accepted_tokens": m.get("spec_accepted_tokens_total"),
        "spec_acceptance_rate": m.get("spec_acceptance_rate"),
        "texts": [r.text for r in results],
        "failed": sum(1 for r in results if not r.ok),
        "errors": common.errors(results),
    }


def run(args: argparse.Namespace) -> int:
    import sys

    if args.url or args.socket or args.target not in ("uma", "uma-socket"):
        return common.run_scenario(args, sys.modules[__name__])
    out = RunDir(NAME, args.out)
    summary: dict = {"meta": common.meta(args, NAME)}
    for label, extra in (("spec_off", ["--spec-draft", "0"]), ("spec_on", [])):
        overrides = {"umad_args": [*args.umad_arg, *extra]}
        try:
            with common.open_target(args, out.sub(f"logs-{label}"), overrides=overrides) as t:
                summary[label] = asyncio.run(common._measure(measure, t, args, out))
        except ServerUnavailable as e:
            print(f"bench {NAME}: server unavailable: {e}", file=sys.stderr)
            return 2
    on, off = summary["spec_on"], summary["spec_off"]
    summary["identical_text"] = on["texts"] == off["texts"]
    if on["decode_tok_per_s"] and off["decode_tok_per_s"]:
        summary["speedup"] = on["decode_tok_per_s"] / off["decode_tok_per_s"]
    summary["failed"] = on["failed"] + off["failed"]
    out.write_json("summary.json", summary)
    common.show(NAME, {k: v for k, v in summary.items() if k != "meta"})
    print(f"\nresults: {out.path}")
    return 1 if summary["failed"] else 0
