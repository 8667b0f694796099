"""What every scenario shares: target arguments, opening the target, running streams,
summaries, progress bars and the run's metadata.

A scenario module defines NAME, KEY_METRICS ([(summary key, "lower"|"higher")] for the peers
table), add_arguments(ap) (calling add_common), `async measure(target, args, run) -> dict`,
and run(args) = run_scenario(args, module). Optional: shape_overrides(args) -> dict.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

from tqdm import tqdm

from uma_serve.bench import scorecard
from uma_serve.bench.report import RunDir, print_table
from uma_serve.bench.servers import KINDS, ServerShape, ServerUnavailable, launch
from uma_serve.bench.stats import Summary
from uma_serve.bench.targets import HttpTarget, RequestResult, RequestSpec, SocketTarget, Target
from uma_serve.bench.workloads import TOKENS_PER_WORD


def add_in_process(ap: argparse.ArgumentParser) -> None:
    """The knobs of scenarios that load the model in-process (engine, warm-floor, calibrate)."""
    ap.add_argument("--model", help="GGUF path (default: the embedded Gemma 3 270M)")
    ap.add_argument("--threads", type=int, default=0, help="0 = all cores")
    ap.add_argument("--n-gpu-layers", type=int, default=0, help="-1 = all; needs a GPU build")
    ap.add_argument("--out", default="bench-results", help="folder for the JSON summary")


def add_common(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("target (uniform across scenarios)")
    g.add_argument(
        "--target",
        choices=KINDS,
        default="uma",
        help="server to start and drive: uma = umad + uma-gateway over HTTP/SSE (default), "
        "uma-socket = umad over its socket, llama-server / batched = the peers",
    )
    g.add_argument("--socket", help="drive an already running umad at this socket instead")
    g.add_argument("--url", help="drive an already running OpenAI-compatible server instead")
    g.add_argument("--model", help="GGUF (default: the embedded Gemma 3 270M)")
    g.add_argument("--n-seq", type=int, default=4, help="parallel sequences (default 4)")
    g.add_argument("--n-ctx", type=int, default=8192, help="total context (default 8192)")
    g.add_argument("--n-batch", type=int, default=512)
    g.add_argument("--n-ubatch", type=int, default=512)
    g.add_argument("--threads", type=int, default=0, help="0 = all cores")
    g.add_argument(
        "--n-gpu-layers",
        type=int,
        default=0,
        help="layers offloaded to the GPU by every started server (-1 = all; needs a GPU build)",
    )
    g.add_argument("--umad-arg", action="append", default=[], help="extra umad flag (repeatable)")
    o = ap.add_argument_group("run")
    o.add_argument("--quick", action="store_true", help="a small run (smoke test, ~a minute)")
    o.add_argument("--out", help="output folder (default bench-results/<scenario>-<time>)")
    o.add_argument("--seed", type=int, default=1234, help="workload and sampling seed")


def add_label_background(ap: argparse.ArgumentParser, what: str) -> None:
    """The option that labels a scenario's bulk work; by default nothing is labeled, as the
    OpenAI SDK and every library on it send plain requests."""
    ap.add_argument(
        "--label-background",
        action="store_true",
        help=f"label {what} qos=background (default: no label, as plain OpenAI clients)",
    )


def bulk_label(args: argparse.Namespace) -> str | None:
    return "background" if getattr(args, "label_background", False) else None


def shape_of(args: argparse.Namespace, overrides: dict | None = None) -> ServerShape:
    from uma_serve.core.config import default_model_path

    shape = ServerShape(
        model=args.model or str(default_model_path()),
        n_seq=args.n_seq,
        n_ctx=args.n_ctx,
        n_batch=args.n_batch,
        n_ubatch=args.n_ubatch,
        threads=args.threads,
        n_gpu_layers=args.n_gpu_layers,
        umad_args=list(args.umad_arg),
    )
    for k, v in (overrides or {}).items():
        setattr(shape, k, v)
    return shape


@contextlib.contextmanager
def open_target(
    args: argparse.Namespace, log_dir: Path, kind: str | None = None, overrides: dict | None = None
) -> Iterator[Target]:
    if args.url and kind is None:
        yield HttpTarget(args.url, name="url", send_qos=True)
    elif args.socket and kind is None:
        yield SocketTarget(args.socket, name="uma-socket")
    else:
        with launch(kind or args.target, shape_of(args, overrides), log_dir) as target:
            yield target


def meta(args: argparse.Namespace, scenario: str) -> dict:
    return {
        "scenario": scenario,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "commit": git_commit(),
        "machine": machine(),
        "argv": sys.argv,
        "args": {k: v for k, v in vars(args).items() if not callable(v)},
    }


def git_commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True
        )
        return out.stdout.strip() or None
    except OSError:
        return None


def machine() -> str:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cores, {model}, {platform.system()} {platform.release()}"


def bar(total: int, desc: str) -> tqdm:
    return tqdm(total=total, desc=desc, unit="req", leave=False, dynamic_ncols=True)


async def warmup(target: Target) -> None:
    """One tiny request first so model load / first-call costs stay out of the numbers."""
    await target.generate(RequestSpec(prompt="Warm up.", max_tokens=2, tag="warmup"))


async def run_concurrent(
    target: Target, specs: Sequence[RequestSpec], concurrency: int, desc: str = ""
) -> tuple[list[RequestResult], float]:
    """Run specs with at most `concurrency` in flight; return results (spec order) and the
    wall time in seconds."""
    sem = asyncio.Semaphore(max(1, concurrency))
    progress = bar(len(specs), desc or "requests")

    async def one(spec: RequestSpec) -> RequestResult:
        async with sem:
            r = await target.generate(spec)
        progress.update(1)
        return r

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(s) for s in specs))
    dt = time.perf_counter() - t0
    progress.close()
    return list(results), dt


def summarize(results: Sequence[RequestResult], duration_s: float) -> Summary:
    s = Summary(duration_s=duration_s)
    for r in results:
        if not r.ok:
            s.requests += 1
            s.failed += 1
            continue
        s.add(r.token_ms, r.n_tokens, r.prompt_tokens or approx_tokens(r.spec.prompt))
    return s


def approx_tokens(text: str) -> int:
    """For servers that report no usage: the workload's words-to-tokens estimate."""
    return int(len(text.split()) * TOKENS_PER_WORD)


def errors(results: Sequence[RequestResult]) -> list[str]:
    return [f"{r.spec.tag}: {r.error or 'no tokens'}" for r in results if not r.ok][:10]


def run_scenario(args: argparse.Namespace, module: ModuleType) -> int:
    name = module.NAME
    run = RunDir(name, args.out)
    summary: dict = {"meta": meta(args, name)}
    overrides = module.shape_overrides(args) if hasattr(module, "shape_overrides") else None
    try:
        with open_target(args, run.sub("logs"), overrides=overrides) as target:
            summary["server"] = target.name
            result = asyncio.run(_measure(module.measure, target, args, run))
    except ServerUnavailable as e:
        print(f"bench {name}: server unavailable: {e}", file=sys.stderr)
        return 2
    summary.update(result)
    summary["files"] = sorted(set(run.files)) + ["summary.json"]
    run.write_json("summary.json", summary)
    show(name, result)
    print(f"\nresults: {run.path}")
    return 1 if result.get("failed", 0) else 0


async def _measure(fn: Callable, target: Target, args: argparse.Namespace, run: RunDir) -> dict:
    """The scenario's result; with UMA Serve's metrics, its scorecard too (scorecard.json)."""
    try:
        await warmup(target)
        before = await scorecard.scrape(target)
        result = await fn(target, args, run)
        after = await scorecard.scrape(target) if before is not None else None
        if before is not None and after is not None:
            result["scorecard"] = scorecard.card(before, after)
            run.write_json("scorecard.json", result["scorecard"])
        return result
    finally:
        await target.aclose()


def show(name: str, result: dict) -> None:
    """Print the flat numeric part of a summary as a two-column table."""
    rows = []
    result = {k: v for k, v in result.items() if "_mean_" not in k and "_p99_" not in k}
    for k, v in result.items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                if "_mean_" in k2 or "_p99_" in k2:
                    continue
                if isinstance(v2, int | float) or v2 is None:
                    rows.append([f"{k}.{k2}", v2])
        elif isinstance(v, int | float) or v is None:
            rows.append([k, v])
    print(f"\n== bench {name} ==")
    print_table(["metric", "value"], rows)
