"""ipc-overhead: the same requests over the core's socket (client library) and through the
gateway (HTTP/SSE); per path TTFT p50/p95, inter-token p50/p95 and CPU time per generated
token of the client (this process) and of the gateway process. CSV
path,ttft_ms,itl_ms,cpu_ms_per_token (one row per request).

Each round sends one prompt down every path, in rotating order, to a daemon with the prefix
cache and speculation off (no path may find the previous one's work), so TTFTs pair up:
"the gateway adds" is the median of the per-round differences. A round's TTFT moves by a
millisecond or two with the prefill tick (the IQR of the differences is 1-4 ms here), so the
default is 100 rounds: the median's standard error is then ~0.15-0.3 ms. Two HTTP clients:
`gateway` (bench/lean_http.py, as light as the socket client, so the difference is the
gateway's) and `gateway-httpx` (httpx, the OpenAI SDK's transport: what an SDK user pays).
Targets, on `gateway`: it adds < 1 ms to TTFT p50 and < 5% to inter-token p50."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import httpx

from uma_serve.bench import common
from uma_serve.bench.daemon import BenchDaemon
from uma_serve.bench.lean_http import LeanHttpTarget
from uma_serve.bench.report import RunDir, print_table
from uma_serve.bench.servers import ServerUnavailable, gateway
from uma_serve.bench.stats import Summary, percentile
from uma_serve.bench.targets import (
    HttpTarget,
    RequestResult,
    RequestSpec,
    SocketTarget,
    Target,
)

NAME = "ipc-overhead"
CLK = os.sysconf("SC_CLK_TCK")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    common.add_common(ap)
    ap.add_argument("--requests", type=int, help="requests per path (default 100, quick 4)")
    ap.add_argument("--max-tokens", type=int, help="tokens per request (default 32, quick 16)")


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def run(args: argparse.Namespace) -> int:
    run_dir = RunDir(NAME, args.out)
    try:
        if args.socket:
            result = _with_socket(args, args.socket, run_dir)
        else:
            shape = common.shape_of(args)
            flags = [*shape.umad_flags(), "--prefix-cache-tokens", "0", "--spec-draft", "0"]
            with BenchDaemon(*flags, log_dir=run_dir.sub("logs")) as d:
                result = _with_socket(args, d.socket, run_dir)
    except ServerUnavailable as e:
        print(f"bench {NAME}: {e}", file=sys.stderr)
        return 2
    summary = {"meta": common.meta(args, NAME), **result}
    summary["files"] = sorted(set(run_dir.files)) + ["summary.json"]
    run_dir.write_json("summary.json", summary)
    print(f"\nresults: {run_dir.path}")
    return 1 if result["failed"] else 0


def _with_socket(args: argparse.Namespace, sock: str, run_dir: RunDir) -> dict:
    with gateway(sock, run_dir.sub("logs") / "gateway.log") as (url, gw):
        return asyncio.run(_measure(args, sock, url, gw.pid, run_dir))


async def _measure(args, sock: str, url: str, gw_pid: int, run_dir: RunDir) -> dict:
    paths: dict[str, Target] = {
        "socket": SocketTarget(sock),
        "gateway": LeanHttpTarget(url, name="gateway"),
        "gateway-httpx": HttpTarget(url, name="gateway-httpx"),
    }
    for t in paths.values():
        await common.warmup(t)
    tally = await _rounds(args, paths, gw_pid)
    for t in paths.values():
        await t.aclose()
    internal = _gateway_added_ms(url)
    header = ["path", "ttft_ms", "itl_ms", "cpu_ms_per_token"]
    run_dir.write_csv("ipc_overhead.csv", header, tally.rows)
    out: dict = {name: _path_summary(s, tally.cpu[name]) for name, s in tally.summaries.items()}
    out.update(_comparisons(out, tally.ttft, internal))
    out["failed"] = tally.failed
    _plot(run_dir, tally.rows)
    _print_results(out, list(paths), internal)
    return out


class _Tally:
    """What the rounds collect per path: its Summary, client and gateway CPU seconds, TTFTs
    (None for a failed request, so rounds pair up) and the CSV rows."""

    def __init__(self, names: list[str]) -> None:
        self.summaries = {k: Summary() for k in names}
        self.cpu = {k: {"client": 0.0, "gateway": 0.0} for k in names}
        self.rows: list[list] = []
        self.failed = 0
        self.ttft: dict[str, list[float | None]] = {k: [] for k in names}

    def add(self, name: str, r: RequestResult, dt: float, dc: float, dg: float) -> None:
        """One request of path ``name``: ``dt`` wall, ``dc`` client and ``dg`` gateway CPU s."""
        self.ttft[name].append(r.token_ms[0] if r.ok and r.token_ms else None)
        if not r.ok:
            self.failed += 1
            self.summaries[name].failed += 1
            return
        s = self.summaries[name]
        s.add(r.token_ms, r.n_tokens, r.prompt_tokens or 0)
        s.duration_s += dt
        self.cpu[name]["client"] += dc
        dg = dg if name != "socket" else 0.0
        self.cpu[name]["gateway"] += dg
        gaps = [b - a for a, b in zip(r.token_ms, r.token_ms[1:], strict=False)]
        per_tok = (dc + dg) * 1000 / r.n_tokens
        self.rows.append(
            [name, round(r.token_ms[0], 3), _r(percentile(gaps, 50)), round(per_tok, 4)]
        )


async def _rounds(args, paths: dict[str, Target], gw_pid: int) -> _Tally:
    """Each round sends one prompt down every path, in rotating order."""
    n_req = args.requests or (4 if args.quick else 100)
    n = args.max_tokens or (16 if args.quick else 32)
    names = list(paths)
    tally = _Tally(names)
    progress = common.bar(len(names) * n_req, NAME)
    for i in range(n_req):
        # two or three tokens: the gateway's cost does not grow with the prompt, and the
        # shortest prefill keeps each TTFT's noise small enough to resolve a millisecond
        prompt = f"{i}."
        for name in names[i % len(names) :] + names[: i % len(names)]:
            spec = RequestSpec(prompt, n, seed=args.seed + i, tag=name)
            c0, g0, t0 = time.process_time(), proc_cpu_s(gw_pid), time.perf_counter()
            r = await paths[name].generate(spec)
            dt = time.perf_counter() - t0
            dc, dg = time.process_time() - c0, proc_cpu_s(gw_pid) - g0
            progress.update(1)
            tally.add(name, r, dt, dc, dg)
    progress.close()
    return tally


def _path_summary(s: Summary, cpu: dict[str, float]) -> dict:
    """One path's figures in summary.json."""
    d = s.to_dict()
    toks = max(1, s.output_tokens)
    return {
        "requests": s.requests,
        "failed": s.failed,
        "output_tokens": s.output_tokens,
        "ttft_p50_ms": d["ttft_p50_ms"],
        "ttft_p95_ms": d["ttft_p95_ms"],
        "itl_p50_ms": d["itl_p50_ms"],
        "itl_p95_ms": d["itl_p95_ms"],
        "client_cpu_ms_per_token": round(cpu["client"] * 1000 / toks, 4),
        "gateway_cpu_ms_per_token": round(cpu["gateway"] * 1000 / toks, 4),
    }


def _comparisons(out: dict, ttft: dict[str, list[float | None]], internal: float | None) -> dict:
    """What the gateway adds to the socket path, and whether the targets are met."""
    s_, g_, h_ = out["socket"], out["gateway"], out["gateway-httpx"]
    c: dict = {}
    c["gateway_adds_ttft_p50_ms"] = _paired(ttft["gateway"], ttft["socket"])
    c["gateway_adds_ttft_iqr_ms"] = _paired_iqr(ttft["gateway"], ttft["socket"])
    c["gateway_itl_p50_ratio"] = _ratio(g_["itl_p50_ms"], s_["itl_p50_ms"])
    c["gateway_httpx_adds_ttft_p50_ms"] = _paired(ttft["gateway-httpx"], ttft["socket"])
    c["gateway_httpx_itl_p50_ratio"] = _ratio(h_["itl_p50_ms"], s_["itl_p50_ms"])
    c["ttft_p50_difference_ms"] = _diff(g_["ttft_p50_ms"], s_["ttft_p50_ms"])
    c["gateway_internal_added_ms_mean"] = internal
    c["targets_met"] = {
        "ttft_p50_under_1ms": _lt(c["gateway_adds_ttft_p50_ms"], 1.0),
        "itl_p50_under_5pct": _lt(c["gateway_itl_p50_ratio"], 1.05),
    }
    return c


def _print_results(out: dict, names: list[str], internal: float | None) -> None:
    keys = [
        "ttft_p50_ms",
        "ttft_p95_ms",
        "itl_p50_ms",
        "itl_p95_ms",
        "client_cpu_ms_per_token",
        "gateway_cpu_ms_per_token",
    ]
    print(f"\n== bench {NAME} ==")
    print_table(["path", *keys], [[k, *(out[k][m] for m in keys)] for k in names])
    print(
        f"gateway adds {out['gateway_adds_ttft_p50_ms']} ms to TTFT (median of paired "
        f"differences, IQR {out['gateway_adds_ttft_iqr_ms']}); "
        f"ITL p50 ratio {out['gateway_itl_p50_ratio']}; "
        f"targets {out['targets_met']}\n"
        f"inside the gateway (its uma_gateway_added_latency_seconds, mean): {internal} ms\n"
        f"with httpx as the client: adds {out['gateway_httpx_adds_ttft_p50_ms']} ms, "
        f"ITL p50 ratio {out['gateway_httpx_itl_p50_ratio']}"
    )


def _plot(run_dir: RunDir, rows: list) -> None:
    from uma_serve.bench.report import plot_bars

    metrics = {}
    for col, label in ((1, "TTFT (ms, median)"), (2, "ITL (ms, median)"), (3, "CPU ms/token")):
        metrics[label] = {
            p: percentile([r[col] for r in rows if r[0] == p and r[col] is not None], 50)
            for p in ("socket", "gateway", "gateway-httpx")
        }
    plot_bars(run_dir, "ipc_overhead.png", "socket vs gateway", metrics)


def _r(x):
    return None if x is None else round(x, 3)


def _diff(a, b):
    return None if a is None or b is None else round(a - b, 3)


def _gateway_added_ms(url: str) -> float | None:
    """The mean of the gateway's own added-latency histogram (every streamed request here)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        if line.startswith("uma_gateway_added_latency_seconds_"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    count = values.get("uma_gateway_added_latency_seconds_count", 0.0)
    total = values.get("uma_gateway_added_latency_seconds_sum", 0.0)
    return round(total / count * 1000, 3) if count else None


def _paired(a: list, b: list) -> float | None:
    """The median of per-round differences a - b (rounds where both succeeded)."""
    diffs = [x - y for x, y in zip(a, b, strict=True) if x is not None and y is not None]
    return _r(percentile(diffs, 50)) if diffs else None


def _paired_iqr(a: list, b: list) -> list[float | None]:
    """The 25th and 75th percentiles of the per-round differences: how noisy the median is."""
    diffs = [x - y for x, y in zip(a, b, strict=True) if x is not None and y is not None]
    return [_r(percentile(diffs, 25)), _r(percentile(diffs, 75))]


def _ratio(a, b):
    return None if a is None or not b else round(a / b, 4)


def _lt(x, lim):
    return None if x is None else bool(x < lim)
