"""ceiling: UMA Serve against llama.cpp's own batched decode (llama-batched-bench, no server,
no sampling) and llama-server, at the same concurrency levels, model and shape.

The ceiling is `llama-batched-bench`'s generation throughput (S_TG: B streams x TG tokens over
the generation time), built from the same llama.cpp sources as the peers. UMA Serve and
llama-server are driven from outside, as `sweep` does (plain streaming requests of TG tokens,
sampled as every scenario's are: T = 0.8, or greedy with UMA_BENCH_TEMPERATURE=0); their
figure is aggregate output tokens/s. The report is UMA / ceiling and
UMA / llama-server per level.

A server's figure counts the time its prompts take; S_TG does not. So the ceiling is also
given *with prompts*: the same B x TG tokens over llama-batched-bench's prompt and generation
time together (T_PP + T_TG), its prompts as long as UMA Serve's were in the run (the servers
run first). That is the work a server does for the same requests, done by llama.cpp alone.
The first level runs twice and its first run is dropped, for llama-batched-bench and the
servers alike: llama-batched-bench's first row pays for warming the device up (a lone
stream's prompt ran at a quarter of its later speed), and a fresh server's first requests
at a shape for building its graphs.

The ceiling runs twice. By default llama-batched-bench gives each sequence its own KV stream:
a tick's attention mask is then each stream's token against that stream's cells. UMA Serve,
like `llama-server --kv-unified`, keeps one KV buffer that all sequences share (prefixes
are shared by tagging cells, not copied), and llama.cpp builds that mask on the host over
every token against every used cell: at 64 streams the mask is 64x larger. `-kvu` runs
llama-batched-bench with the unified layout, the ceiling for that layout.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
from typing import NamedTuple

from uma_serve.bench import common, peers_build, sweep
from uma_serve.bench.report import RunDir, print_table
from uma_serve.bench.servers import ServerShape, ServerUnavailable
from uma_serve.bench.targets import Target

NAME = "ceiling"
# | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
ROW = re.compile(r"^\|" + r"\s*([\d.]+)\s*\|" * 10)
DEFAULT_PROMPT_TOKENS = 64  # without a UMA run to take the prompts' length from


class Ceiling(NamedTuple):
    """llama-batched-bench at one level, tokens/s: ``generation`` is its S_TG, ``with_prompts``
    the same tokens over its prompt and generation time together."""

    generation: float
    with_prompts: float


def add_arguments(ap: argparse.ArgumentParser) -> None:
    common.add_common(ap)
    ap.add_argument("--levels", default="1,4,16,32", help="concurrency levels (default 1,4,16,32)")
    ap.add_argument("--max-tokens", type=int, default=128, help="generated tokens per stream")
    ap.add_argument("--prompt-tokens", type=int, help="batched-bench prompt (-npp; default: "
                    "as long as UMA Serve's prompts in the run, else 64)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=1, help="requests per stream (servers)")
    ap.add_argument("--servers", default="uma,llama-server", help="servers beside the ceiling")


def batched_bench_args(
    shape: ServerShape, levels: list[int], npp: int, ntg: int, unified: bool = False
) -> list[str]:
    """llama-batched-bench over the servers' shape: same model, context, batch, threads; the
    first level twice (the first row warms the device up); ``unified``: one KV buffer for all
    sequences (-kvu), as UMA Serve keeps it."""
    return [*(["-kvu"] if unified else []),
        "-m", shape.model, "-c", str(max(shape.n_ctx, max(levels) * (npp + ntg))),
        "-b", str(max(shape.n_batch, 2048)), "-ub", str(shape.n_ubatch),
        "-npp", str(npp), "-ntg", str(ntg), "-npl", ",".join(map(str, levels[:1] + levels)),
        "-ngl", str(99 if shape.n_gpu_layers < 0 else shape.n_gpu_layers),
        "-t", str(shape.n_threads), "-fa", "auto",
    ]  # fmt: skip


def parse_batched_bench(text: str) -> dict[int, Ceiling]:
    """Each level's ceiling by the number of parallel streams (B), from its table; a level's
    last row (the warm-up's comes first)."""
    out = {}
    for line in text.splitlines():
        if m := ROW.match(line):
            _, tg, b, _, _, _, _, s_tg, t, _ = map(float, m.groups())
            out[int(b)] = Ceiling(s_tg, round(b * tg / t, 2) if t else 0.0)
    return out


def prompt_tokens(args: argparse.Namespace, servers: dict[str, dict]) -> int:
    """The prompt length the ceiling runs with: the option, else UMA Serve's mean prompt."""
    if args.prompt_tokens:
        return args.prompt_tokens
    levels = [v for k, v in servers.get("uma", {}).items() if k.startswith("c") and v]
    n, tokens = sum(v["requests"] for v in levels), sum(v["prompt_tokens"] for v in levels)
    return round(tokens / n) if n and tokens else DEFAULT_PROMPT_TOKENS


def run_ceiling(
    shape: ServerShape, args: argparse.Namespace, run: RunDir, npp: int, unified: bool = False
) -> dict[int, Ceiling]:
    binary = peers_build.ensure_batched_bench()
    cmd = [str(binary), *batched_bench_args(shape, sweep.levels_of(args), npp, args.max_tokens,
                                             unified)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    log = "batched-bench-kvu.log" if unified else "batched-bench.log"
    (run.path / log).write_text(" ".join(cmd) + "\n" + done.stdout + done.stderr)
    if done.returncode != 0:
        raise ServerUnavailable(f"llama-batched-bench failed (rc {done.returncode})")
    return parse_batched_bench(done.stdout)


def run_server(server: str, args: argparse.Namespace, run: RunDir) -> dict:
    sub = RunDir(NAME, str(run.path / server))
    with common.open_target(args, sub.sub("logs"), kind=server) as target:
        return asyncio.run(common._measure(measure, target, args, sub))


async def measure(target: Target, args: argparse.Namespace, run: RunDir) -> dict:
    """The sweep's levels, after the first one once unmeasured (as llama-batched-bench's)."""
    await sweep.warm_up(target, args)
    return await sweep.measure(target, args, run)


HEADER = ["streams", "ceiling tok/s", "ceiling -kvu tok/s", "with prompts tok/s",
          "with prompts -kvu tok/s", "uma tok/s", "uma/ceiling", "uma/ceiling -kvu",
          "uma/with prompts", "uma/with prompts -kvu", "llama-server tok/s",
          "uma/llama-server"]  # fmt: skip


def table(
    levels: list[int],
    ceiling: dict[int, Ceiling],
    servers: dict[str, dict],
    unified: dict[int, Ceiling] | None = None,
) -> list[list]:
    """A row per level, as HEADER names its columns."""

    def tps(server: str, c: int) -> float | None:
        return (servers.get(server, {}).get(f"c{c}") or {}).get("output_tok_per_s")

    none = Ceiling(0.0, 0.0)
    rows = []
    for c in levels:
        uma, peer = tps("uma", c), tps("llama-server", c)
        top, top_u = ceiling.get(c, none), (unified or {}).get(c, none)
        tops = [top.generation, top_u.generation, top.with_prompts, top_u.with_prompts]
        rows.append([c, *(t or None for t in tops), uma, *(_ratio(uma, t) for t in tops),
                     peer, _ratio(uma, peer)])  # fmt: skip
    return rows


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def run(args: argparse.Namespace) -> int:
    run_dir = RunDir(NAME, args.out)
    levels = sweep.levels_of(args)
    shape = common.shape_of(args)
    summary: dict = {"meta": common.meta(args, NAME), "levels": levels}
    servers, failed = {}, 0
    for server in args.servers.split(","):
        try:
            servers[server] = run_server(server, args, run_dir)
            failed += int(servers[server].get("failed") or 0)
        except ServerUnavailable as e:
            print(f"bench ceiling: {server} unavailable: {e}", file=sys.stderr)
    npp = prompt_tokens(args, servers)
    try:
        ceiling = run_ceiling(shape, args, run_dir, npp)
        unified = run_ceiling(shape, args, run_dir, npp, unified=True)
    except (ServerUnavailable, FileNotFoundError, subprocess.CalledProcessError) as e:
        print(f"bench ceiling: no ceiling: {e}", file=sys.stderr)
        return 2
    rows = table(levels, ceiling, servers, unified)
    run_dir.write_csv("ceiling.csv", HEADER, rows)
    summary |= {"prompt_tokens": npp, "servers": servers, "table": rows, "failed": failed,
                "ceiling": {b: c._asdict() for b, c in ceiling.items()},
                "ceiling_unified": {b: c._asdict() for b, c in unified.items()}}  # fmt: skip
    run_dir.write_json("summary.json", summary)
    print(f"\n== bench {NAME} ==")
    print_table(HEADER, rows)
    print(f"\nresults: {run_dir.path}")
    return 1 if failed else 0
