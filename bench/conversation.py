"""conversation: N concurrent multi-turn chats that re-send their whole history every turn
(as every OpenAI client does), alone and under the paste storm, rounds alternated; per-turn
TTFT, answer ITL and the share of each prompt the server's prefix cache served. With
``--agent`` each step after the first re-sends the transcript with an OpenAI tool call and
its result (a coding agent reading files) instead of a user's question."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from uma_serve.bench import common, storm
from uma_serve.bench.report import TOKEN_HEADER, RunDir, plot_bars, token_rows
from uma_serve.bench.stats import percentile, ratio
from uma_serve.bench.targets import RequestResult, RequestSpec, Target
from uma_serve.bench.workloads import Workload

NAME = "conversation"
KEY_METRICS = [
    ("ratio.ttft_p50", "lower"),
    ("ratio.ttft_max", "lower"),
    ("ratio.itl_p95", "lower"),
    ("ratio.cached_share", "higher"),
    ("storm.ttft_p50_ms", "lower"),
    ("background.prompt_tok_per_s", "higher"),
]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    common.add_common(ap)
    ap.add_argument("--sessions", type=int, default=1, help="concurrent conversations")
    ap.add_argument("--turns", type=int, help="turns per conversation (default 6, quick 3)")
    ap.add_argument("--system-tokens", type=int, default=300, help="the app's system prompt")
    ap.add_argument("--first-tokens", type=int, default=150, help="the first question")
    ap.add_argument("--follow-tokens", type=int, default=50, help="each follow-up question")
    ap.add_argument("--reply-tokens", type=int, help="answer length (default 48, quick 16)")
    ap.add_argument("--think-s", type=float, default=0.5, help="the user's pause between turns")
    ap.add_argument("--clients", type=int, help="storm clients K (default 3, quick 2)")
    ap.add_argument("--doc-tokens", type=int, help="document length (default 1200, quick 250)")
    ap.add_argument("--answer-tokens", type=int, default=8, help="the documents' answer length")
    ap.add_argument("--lead-s", type=float, default=1.0, help="storm head start (s)")
    ap.add_argument("--drain-s", type=float, default=300.0, help="bound on the storm's drain")
    ap.add_argument("--rounds", type=int, default=2, help="alone and storm phases, alternated")
    ap.add_argument(
        "--agent",
        action="store_true",
        help="steps send a tool call and its result (--follow-tokens x 3) instead of a question",
    )
    common.add_label_background(ap, "the storm's documents")


async def conversation(
    target: Target, args: argparse.Namespace, wl: Workload, system: str, tag: str
) -> list[RequestResult]:
    """One user's chat: each turn sends the system prompt and the whole history so far."""
    turns = args.turns or (3 if args.quick else 6)
    reply = args.reply_tokens or (16 if args.quick else 48)
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": wl.question(args.first_tokens)},
    ]
    results: list[RequestResult] = []
    for turn in range(turns):
        spec = RequestSpec("", reply, seed=args.seed + turn, tag=f"{tag}-t{turn}")
        spec.messages = list(messages)
        r = await target.generate(spec)
        results.append(r)
        messages.append({"role": "assistant", "content": r.text or "(no answer)"})
        if turn + 1 < turns:
            await asyncio.sleep(args.think_s)
            messages += next_turn(args, wl, messages[-1], f"{tag}-{turn}")
    return results


def next_turn(args: argparse.Namespace, wl: Workload, answer: dict, call_id: str) -> list[dict]:
    """What the client adds before its next request: a question, or an agent's tool call on
    its last answer (beside the answer's text, as OpenAI's assistant messages allow) and the
    tool's result."""
    if not args.agent:
        return [{"role": "user", "content": wl.question(args.follow_tokens)}]
    path = f"src/module_{call_id}.py"
    call = {
        "id": f"call_{call_id}",
        "type": "function",
        "function": {"name": "read_file", "arguments": json.dumps({"path": path})},
    }
    result = f"# {path}\n{wl.words(3 * args.follow_tokens)}"
    answer["tool_calls"] = [call]
    return [{"role": "tool", "tool_call_id": call["id"], "content": result}]


async def phase(
    target: Target, args: argparse.Namespace, wl: Workload, system: str, tag: str
) -> list[RequestResult]:
    """N conversations at once, their starts spread over one think time."""

    async def one(i: int) -> list[RequestResult]:
        await asyncio.sleep(args.think_s * i / max(args.sessions, 1))
        return await conversation(target, args, wl, system, f"{tag}-s{i}")

    runs = await asyncio.gather(*(one(i) for i in range(args.sessions)))
    return [r for run in runs for r in run]


async def measure(target: Target, args: argparse.Namespace, run: RunDir) -> dict:
    wl = Workload(args.seed)
    system = wl.system_prompt(args.system_tokens)
    k = args.clients or (2 if args.quick else 3)
    args.doc_tokens = args.doc_tokens or (250 if args.quick else 1200)
    # the app's system prompt has been seen before the first measured turn, in both phases
    hello = [{"role": "system", "content": system}, {"role": "user", "content": "Hello."}]
    await target.generate(RequestSpec("", 2, messages=hello))
    alone: list[RequestResult] = []
    loaded: list[RequestResult] = []
    bg: list[RequestResult] = []
    t_start = time.perf_counter()
    load_s = 0.0
    for r in range(max(1, args.rounds)):
        alone += await phase(target, args, wl, system, f"alone{r}")
        fg = lambda r=r: phase(target, args, wl, system, f"storm{r}")  # noqa: E731
        got, docs, dt, _ = await storm.under_load(target, args, wl, [storm.background_loop] * k, fg)
        loaded += got
        bg += docs
        load_s += dt
    rows = token_rows(target.name, alone + loaded + bg, t_start)
    run.write_csv("tokens.csv", TOKEN_HEADER, rows)
    out = report(alone, loaded, bg, load_s)
    a, s = out["alone"]["ttft_p50_ms_by_turn"], out["storm"]["ttft_p50_ms_by_turn"]
    bars = {f"turn {t}: TTFT p50 ms": {"alone": a[t], "storm": s.get(t)} for t in a}
    plot_bars(run, "ttft_by_turn.png", f"conversation on {target.name}", bars)
    return out


def figures(results: list[RequestResult]) -> dict:
    """Per-turn TTFT, the answers' ITL and the cached share of the prompts."""
    ok = [r for r in results if r.ok]
    s = common.summarize(results, 0.0).to_dict()
    ttfts = [r.token_ms[0] for r in ok if r.token_ms]
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    by_turn: dict[int, list[float]] = {}
    for r in ok:
        by_turn.setdefault(int(r.spec.tag.rsplit("-t", 1)[1]), []).append(r.token_ms[0])
    turns = {str(t): percentile(ms, 50) for t, ms in sorted(by_turn.items())}
    return {
        "requests": len(results),
        "failed": len(results) - len(ok),
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_max_ms": max(ttfts) if ttfts else None,
        "itl_p50_ms": s["itl_p50_ms"],
        "itl_p95_ms": s["itl_p95_ms"],
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_share": round(cached / prompt, 4) if prompt else None,
        "ttft_p50_ms_by_turn": turns,
        "ttft_ms": {r.spec.tag: round(r.token_ms[0], 1) for r in ok},
        "cached": {r.spec.tag: [r.cached_tokens, r.prompt_tokens] for r in ok},
    }


def report(
    alone: list[RequestResult], loaded: list[RequestResult], bg: list[RequestResult], dt: float
) -> dict:
    a, s = figures(alone), figures(loaded)
    done = [r for r in bg if r.ok]
    docs = common.summarize(done, dt).to_dict()
    return {
        "alone": a,
        "storm": s,
        "ratio": {
            "ttft_p50": ratio(s["ttft_p50_ms"], a["ttft_p50_ms"]),
            "ttft_max": ratio(s["ttft_max_ms"], a["ttft_max_ms"]),
            "itl_p95": ratio(s["itl_p95_ms"], a["itl_p95_ms"]),
            "cached_share": ratio(s["cached_share"], a["cached_share"]),
        },
        "background": {
            "completed": len(done),
            "prompt_tokens": docs["prompt_tokens"],
            "prompt_tok_per_s": docs["prompt_tok_per_s"],
        },
        "failed": a["failed"] + s["failed"] + len(bg) - len(done),
        "errors": common.errors(alone + loaded + bg),
    }


def run(args: argparse.Namespace) -> int:
    return common.run_scenario(args, sys.modules[__name__])
