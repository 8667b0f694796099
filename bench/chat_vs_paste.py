"""chat-vs-paste: two apps on one server, one chat session while another app pastes one big
document. Chat TTF5, worst pause and ITL alone and with the paste (ratios); the paste's TTFT
and end-to-end time."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from uma_serve.bench import common, solo, storm
from uma_serve.bench.report import RunDir
from uma_serve.bench.targets import RequestSpec, Target
from uma_serve.bench.workloads import Workload

NAME = "chat-vs-paste"
KEY_METRICS = [
    ("interactive.ttf5_p50_ms", "lower"),
    ("interactive.worst_pause_max_ms", "lower"),
    ("ratio_to_solo.ttf5_p50_ms", "lower"),
    ("ratio_to_solo.worst_pause_max_ms", "lower"),
    ("paste.e2e_ms", "lower"),
]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    solo.add_arguments(ap)
    ap.add_argument("--paste-tokens", type=int, help="paste length (default 1600, quick 300)")
    ap.add_argument("--paste-answer", type=int, default=32, help="tokens answered to the paste")
    ap.add_argument("--lead-s", type=float, default=0.3, help="paste head start (s)")
    common.add_label_background(ap, "the paste")


async def measure(target: Target, args: argparse.Namespace, run: RunDir) -> dict:
    wl = Workload(args.seed)
    base, base_dt = await solo.run_solo(target, args, wl)
    n = args.paste_tokens or (300 if args.quick else 1600)
    paste = RequestSpec(
        wl.document(n), args.paste_answer, qos=common.bulk_label(args), seed=args.seed, tag="paste"
    )
    t_start = time.perf_counter()
    paste_task = asyncio.create_task(target.generate(paste))
    await asyncio.sleep(args.lead_s)
    chat, _ = await solo.run_solo(target, args, wl, tag="chat")
    paste_res = await paste_task
    dt = time.perf_counter() - t_start
    out = storm.report(target, run, base, base_dt, chat, [paste_res], dt, t_start, NAME)
    out.pop("background")
    out["paste"] = {
        "ok": paste_res.ok,
        "prompt_tokens": paste_res.prompt_tokens or common.approx_tokens(paste.prompt),
        "ttft_ms": paste_res.token_ms[0] if paste_res.token_ms else None,
        "e2e_ms": paste_res.token_ms[-1] if paste_res.token_ms else None,
        "output_tokens": paste_res.n_tokens,
    }
    return out


def run(args: argparse.Namespace) -> int:
    return common.run_scenario(args, sys.modules[__name__])
