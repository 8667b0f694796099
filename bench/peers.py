"""peers: run scenarios against UMA Serve, llama.cpp's llama-server and llama-cpp-python's
batched server (examples/server/server.py), one after the other on the same GGUF, threads,
context, batch and parallel sequences; a side-by-side table with ratios, and bar charts.
Peers are built once and cached (python -m uma_serve.bench.peers_build); a peer that is not
available is reported, and the others still run."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
import time

from uma_serve.bench import common, peers_build
from uma_serve.bench.report import RunDir, plot_bars, plot_frontier, print_table
from uma_serve.bench.servers import ServerUnavailable, command_lines

NAME = "peers"
PEER_SCENARIOS = {
    "solo": "solo",
    "sweep": "sweep",
    "storm": "storm",
    "storm-labeled": "storm",  # the storm's documents labeled background (UMA only)
    "agent-chain": "agent_chain",
    "chat-vs-paste": "chat_vs_paste",
    "mixed-load": "mixed_load",
    "long-ctx": "long_ctx",
    "shared-prefix": "shared_prefix",
    "repetitive": "repetitive",
    "conversation": "conversation",
    "conversation-agent": "conversation",  # the agent's steps: tool calls and their results
}
DEFAULT = "solo,sweep,storm,storm-labeled,agent-chain"
LABELED = {"storm-labeled"}  # scenarios run with --label-background, against UMA only
SERVERS = ("uma", "llama-server", "batched")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    common.add_common(ap)
    ap.add_argument("--scenarios", default=DEFAULT, help=f"comma list or 'all' (default {DEFAULT})")
    ap.add_argument("--servers", default=",".join(SERVERS), help="comma list of servers")
    ap.add_argument("--build", action="store_true", help="build missing peers first")
    ap.add_argument("--levels", help="sweep levels (passed to sweep)")
    ap.add_argument("--storm-rounds", type=int, help="storm's --rounds (solo/storm pairs)")
    ap.add_argument(
        "--report-only",
        metavar="DIR",
        help="rebuild the table and charts from an earlier (possibly interrupted) peers run",
    )


def scenario_args(name: str, args: argparse.Namespace) -> argparse.Namespace:
    module = importlib.import_module(f"uma_serve.bench.{PEER_SCENARIOS[name]}")
    sub = argparse.ArgumentParser()
    module.add_arguments(sub)
    argv = ["--quick"] if args.quick else []
    if name == "sweep" and args.levels:
        argv += ["--levels", args.levels]
    if name.startswith("storm") and args.storm_rounds:
        argv += ["--rounds", str(args.storm_rounds)]
    if name in LABELED:
        argv += ["--label-background"]
    if name == "conversation-agent":
        argv += ["--agent"]
    sargs = sub.parse_args(argv)
    shape_keys = ("model", "n_seq", "n_ctx", "n_batch", "n_ubatch", "threads", "n_gpu_layers")
    for k in (*shape_keys, "umad_arg", "seed"):
        setattr(sargs, k, getattr(args, k))
    sargs.url = sargs.socket = None
    return sargs


def get(d: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(part)
    return d


def report_only(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    root = Path(args.report_only)
    results: dict[str, dict[str, dict]] = {}
    for f in sorted(root.glob("*/*/summary.json")):
        results.setdefault(f.parent.parent.name, {})[f.parent.name] = json.loads(f.read_text())
    names = [n for n in PEER_SCENARIOS if n in results]
    servers = [s for s in SERVERS if any(s in results[n] for n in names)]
    tables = report(RunDir(NAME, str(root)), names, servers, results)
    (root / "tables.json").write_text(json.dumps(tables, indent=2) + "\n")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.report_only:
        return report_only(args)
    names = list(PEER_SCENARIOS) if args.scenarios == "all" else args.scenarios.split(",")
    servers = args.servers.split(",")
    run_dir = RunDir(NAME, args.out)
    if args.build:
        _build_peers()
    results, unavailable, failed = _run_all(args, names, servers, run_dir)
    ran = [s for s in servers if s not in unavailable]
    tables = report(run_dir, names, ran, results)
    shape = common.shape_of(args)
    summary = {
        "meta": common.meta(args, NAME),
        "servers": ran,
        "unavailable": unavailable,
        "commands": {s: command_lines(s, shape) for s in servers},
        "tables": tables,
        "results": results,
        "failed": failed,
    }
    summary["files"] = sorted(set(run_dir.files)) + ["summary.json"]
    run_dir.write_json("summary.json", summary)
    for s, why in unavailable.items():
        print(f"UNAVAILABLE {s}: {why}")
    print(f"\nresults: {run_dir.path}")
    return 1 if failed or not ran else 0


def _build_peers() -> None:
    """Build (or find cached) the peer servers; a failed build is reported, not fatal."""
    for fn in (peers_build.ensure_llama_server, peers_build.ensure_batched):
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            print(f"[peers] build failed: {e}", file=sys.stderr)


def _run_all(
    args: argparse.Namespace, names: list[str], servers: list[str], run_dir: RunDir
) -> tuple[dict[str, dict[str, dict]], dict[str, str], int]:
    """Every scenario on every server, server by server: (results by scenario and server,
    why each unavailable server was, failed requests)."""
    results: dict[str, dict[str, dict]] = {n: {} for n in names}
    unavailable: dict[str, str] = {}
    failed = 0
    for server in servers:
        for name in names:
            if server in unavailable:
                break
            if name in LABELED and server != "uma":  # a label means nothing to the peers
                continue
            res = _run_one(args, server, name, run_dir, unavailable)
            if res is None:
                break
            results[name][server] = res
            failed += int(res.get("failed") or 0)
    return results, unavailable, failed


def _run_one(
    args: argparse.Namespace, server: str, name: str, run_dir: RunDir, unavailable: dict[str, str]
) -> dict | None:
    """Scenario ``name`` on ``server``, its summary.json written; None (and the reason in
    ``unavailable``) if the server could not be started."""
    module = importlib.import_module(f"uma_serve.bench.{PEER_SCENARIOS[name]}")
    sargs = scenario_args(name, args)
    sub = RunDir(name, str(run_dir.path / name / server))
    ov = module.shape_overrides(sargs) if hasattr(module, "shape_overrides") else None
    print(f"[peers] {server}: {name}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        with common.open_target(sargs, sub.sub("logs"), kind=server, overrides=ov) as t:
            res = asyncio.run(common._measure(module.measure, t, sargs, sub))
    except ServerUnavailable as e:
        unavailable[server] = str(e)
        print(f"[peers] {server} unavailable: {e}", file=sys.stderr)
        return None
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    sub.write_json("summary.json", {"meta": common.meta(sargs, name), **res})
    return res


def report(run_dir: RunDir, names: list[str], servers: list[str], results: dict) -> dict:
    base = "uma" if "uma" in servers else (servers[0] if servers else None)
    peers = [s for s in servers if s != base]
    header = ["scenario", "metric", *servers, *(f"{base}/{p}" for p in peers)]
    rows, csv_rows, tables = [], [], {}
    for name in names:
        module = importlib.import_module(f"uma_serve.bench.{PEER_SCENARIOS[name]}")
        bars = {}
        for key, _better in module.KEY_METRICS:
            vals = {s: get(results[name].get(s, {}), key) for s in servers}
            ratios = [_ratio(vals.get(base), vals.get(p)) for p in peers]
            row = [name, key, *(vals[s] for s in servers), *ratios]
            rows.append(row)
            csv_rows.append(row)
            tables.setdefault(name, {})[key] = {
                "values": vals,
                "ratios": dict(zip([f"{base}/{p}" for p in peers], ratios, strict=True)),
            }
            bars[key] = vals
        if servers:
            plot_bars(run_dir, f"{name}.png", f"peers: {name}", bars)
        if name == "sweep":
            from uma_serve.bench.sweep import frontier

            plot_frontier(
                run_dir,
                "sweep_frontier.png",
                {s: frontier(results[name][s]) for s in servers if s in results[name]},
            )
    run_dir.write_csv("peers.csv", header, csv_rows)
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]
    (run_dir.path / "peers.md").write_text("\n".join(md) + "\n")
    run_dir.files.append("peers.md")
    print(f"\n== bench peers (ratios: {base} / peer; lower is better for ms) ==")
    print_table(header, rows)
    return tables


def _md(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}"
    return str(x)


def _ratio(a, b):
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
        return None
    return round(a / b, 3)
