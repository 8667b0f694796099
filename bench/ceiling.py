"""ceiling: UMA Serve against llama.cpp's own batched decode (llama-batched-bench, no server,
no sampling) and llama-server, at the same concurrency levels, model and shape.

The ceiling is `llama-batched-bench`'s generation throughput (S_TG: B streams x TG tokens over
the generation time), built from the same llama.cpp sources as the peers. UMA Serve and
llama-server are driven from outside, as `sweep` does (plain streaming requests, greedy, TG
tokens each); their figure is aggregate output tokens/s. The report is UMA / ceiling and
UMA / llama-server per level.

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

from uma_serve.bench import common, peers_build, sweep
from uma_serve.bench.report import RunDir, print_table
from uma_serve.bench.servers import ServerShape, ServerUnavailable

NAME = "ceiling"
# | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|(?:\s*[\d.]+\s*\|){4}\s*([\d.]+)\s*\|")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    common.add_common(ap)
    ap.add_argument("--levels", default="1,4,16,32", help="concurrency levels (default 1,4,16,32)")
    ap.add_argument("--max-tokens", type=int, default=128, help="generated tokens per stream")
    ap.add_argument("--prompt-tokens", type=int, default=64, help="batched-bench prompt (-npp)")
    ap.add_argument("--rounds", type=int, default=1, help="requests per stream (servers)")
    ap.add_argument("--servers", default="uma,llama-server", help="servers beside the ceiling")


def batched_bench_args(
    shape: ServerShape, levels: list[int], npp: int, ntg: int, unified: bool = False
) -> list[str]:
    """llama-batched-bench over the servers' shape: same model, context, batch, threads;
    ``unified``: one KV buffer for all sequences (-kvu), as UMA Serve keeps it."""
    return [*(["-kvu"] if unified else []),
        "-m", shape.model, "-c", str(max(shape.n_ctx, max(levels) * (npp + ntg))),
        "-b", str(max(shape.n_batch, 2048)), "-ub", str(shape.n_ubatch),
        "-npp", str(npp), "-ntg", str(ntg), "-npl", ",".join(map(str, levels)),
        "-ngl", str(99 if shape.n_gpu_layers < 0 else shape.n_gpu_layers),
        "-t", str(shape.n_threads), "-fa", "auto",
    ]  # fmt: skip


def parse_batched_bench(text: str) -> dict[int, float]:
    """Generation tokens/s by the number of parallel streams (B), from its table."""
    return {int(m[3]): float(m[4]) for line in text.splitlines() if (m := ROW.match(line))}


def run_ceiling(
    shape: ServerShape, args: argparse.Namespace, run: RunDir, unified: bool = False
) -> dict[int, float]:
    binary = peers_build.ensure_batched_bench()
    cmd = [str(binary), *batched_bench_args(shape, sweep.levels_of(args), args.prompt_tokens,
                                             args.max_tokens, unified)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    log = "batched-bench-kvu.log" if unified else "batched-bench.log"
    (run.path / log).write_text(" ".join(cmd) + "\n" + done.stdout + done.stderr)
    if done.returncode != 0:
        raise ServerUnavailable(f"llama-batched-bench failed (rc {done.returncode})")
    return parse_batched_bench(done.stdout)


def run_server(server: str, args: argparse.Namespace, run: RunDir) -> dict:
    sub = RunDir(NAME, str(run.path / server))
    with common.open_target(args, sub.sub("logs"), kind=server) as target:
        return asyncio.run(common._measure(sweep.measure, target, args, sub))


def table(
    levels: list[int],
    ceiling: dict[int, float],
    servers: dict[str, dict],
    unified: dict[int, float] | None = None,
) -> list[list]:
    def tps(server: str, c: int) -> float | None:
        return (servers.get(server, {}).get(f"c{c}") or {}).get("output_tok_per_s")

    rows = []
    for c in levels:
        uma, peer = tps("uma", c), tps("llama-server", c)
        top, top_u = ceiling.get(c), (unified or {}).get(c)
        rows.append([c, top, top_u, uma, _ratio(uma, top), _ratio(uma, top_u), peer,
                     _ratio(uma, peer)])  # fmt: skip
    return rows


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def run(args: argparse.Namespace) -> int:
    run_dir = RunDir(NAME, args.out)
    levels = sweep.levels_of(args)
    shape = common.shape_of(args)
    summary: dict = {"meta": common.meta(args, NAME), "levels": levels}
    try:
        ceiling = run_ceiling(shape, args, run_dir)
        unified = run_ceiling(shape, args, run_dir, unified=True)
    except (ServerUnavailable, FileNotFoundError, subprocess.CalledProcessError) as e:
        print(f"bench ceiling: no ceiling: {e}", file=sys.stderr)
        return 2
    servers, failed = {}, 0
    for server in args.servers.split(","):
        try:
            servers[server] = run_server(server, args, run_dir)
            failed += int(servers[server].get("failed") or 0)
        except ServerUnavailable as e:
            print(f"bench ceiling: {server} unavailable: {e}", file=sys.stderr)
    header = ["streams", "ceiling tok/s", "ceiling -kvu tok/s", "uma tok/s", "uma/ceiling",
              "uma/ceiling -kvu", "llama-server tok/s", "uma/llama-server"]  # fmt: skip
    rows = table(levels, ceiling, servers, unified)
    run_dir.write_csv("ceiling.csv", header, rows)
    summary |= {"ceiling_tok_per_s": ceiling, "ceiling_unified_tok_per_s": unified,
                "servers": servers, "table": rows, "failed": failed}  # fmt: skip
    run_dir.write_json("summary.json", summary)
    print(f"\n== bench {NAME} ==")
    print_table(header, rows)
    print(f"\nresults: {run_dir.path}")
    return 1 if failed else 0
