"""A bench run's output folder: raw CSVs, summary.json and PNG plots (matplotlib, Agg)."""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from uma_serve.bench.targets import RequestResult  # noqa: E402

BACKGROUND_LABELS = ("background", "decoder", "doc", "paste")  # drawn thin and grey
TOKEN_HEADER = ["server", "tag", "request", "qos", "token_idx", "ts_ms", "gap_ms"]


class RunDir:
    def __init__(self, scenario: str, out: str | None = None) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.path = Path(out) if out else Path("bench-results") / f"{scenario}-{stamp}"
        self.path.mkdir(parents=True, exist_ok=True)
        self.files: list[str] = []

    def sub(self, name: str) -> Path:
        d = self.path / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def write_csv(self, name: str, header: Sequence[str], rows: Iterable[Sequence]) -> Path:
        f = self.path / name
        with open(f, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(header)
            w.writerows(rows)
        self.files.append(name)
        return f

    def write_json(self, name: str, obj: object) -> Path:
        f = self.path / name
        f.write_text(json.dumps(obj, indent=2, default=str) + "\n")
        self.files.append(name)
        return f

    def savefig(self, fig: plt.Figure, name: str) -> Path:
        f = self.path / name
        fig.tight_layout()
        fig.savefig(f, dpi=110)
        plt.close(fig)
        self.files.append(name)
        return f


def token_rows(server: str, results: Sequence[RequestResult], t0: float) -> list[list]:
    """One row per content chunk, times relative to the run start t0 (perf_counter s)."""
    rows: list[list] = []
    for i, r in enumerate(results):
        base = (r.t_send - t0) * 1000.0
        prev = None
        for k, ms in enumerate(r.token_ms):
            gap = "" if prev is None else round(ms - prev, 3)
            rows.append([server, r.spec.tag, i, r.spec.qos or "", k, round(base + ms, 3), gap])
            prev = ms
    return rows


def plot_gaps(run: RunDir, name: str, title: str, streams: Sequence[tuple[str, list, list]]):
    """Inter-token gaps over time, one line per stream: (label, ts_ms, gap_ms). Freezes are
    the spikes; a log y-axis keeps a 30 ms cadence and a 2 s freeze readable together."""
    fig, ax = plt.subplots(figsize=(10, 4.5))
    seen: set[str] = set()
    for k, (label, ts, gap) in enumerate(streams):
        if not ts:
            continue
        bg = label.startswith(BACKGROUND_LABELS)
        legend = label.split("-")[0] if bg else label
        style = (
            {"color": "0.6", "lw": 0.6, "markersize": 2, "alpha": 0.7, "zorder": 1}
            if bg
            else {"color": f"C{k % 10}", "lw": 1.2, "markersize": 3, "zorder": 3}
        )
        ax.plot(
            [t / 1000.0 for t in ts],
            gap,
            marker=".",
            label=None if legend in seen else legend,
            **style,
        )
        seen.add(legend)
    ax.set_yscale("log")
    ax.set_xlabel("time since run start (s)")
    ax.set_ylabel("inter-token gap (ms, log)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if seen and len(seen) <= 16:
        ax.legend(fontsize=7, loc="upper right")
    return run.savefig(fig, name)


def plot_frontier(run: RunDir, name: str, series: dict[str, list[tuple[int, float, float]]]):
    """Throughput-latency frontier: x = aggregate output tok/s, y = ITL p95; one line per
    server, points labelled with their concurrency."""
    fig, ax = plt.subplots(figsize=(7, 5))
    for server, pts in series.items():
        pts = [pt for pt in pts if pt[1] is not None and pt[2] is not None]
        if not pts:
            continue
        ax.plot([pt[1] for pt in pts], [pt[2] for pt in pts], marker="o", label=server)
        for conc, x, y in pts:
            ax.annotate(str(conc), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("aggregate output tokens/s")
    ax.set_ylabel("ITL p95 (ms)")
    ax.set_title("throughput-latency frontier (labels: concurrent streams)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return run.savefig(fig, name)


def plot_bars(run: RunDir, name: str, title: str, metrics: dict[str, dict[str, float | None]]):
    """Grouped bars: metrics = {metric: {server: value}}, one subplot per metric."""
    n = max(1, len(metrics))
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, (metric, by_server) in zip(axes.flat, metrics.items(), strict=False):
        servers = list(by_server)
        vals = [by_server[s] or 0.0 for s in servers]
        ax.bar(servers, vals, color=["C0", "C1", "C2", "C3"][: len(servers)])
        ax.set_title(metric, fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
        for i, v in enumerate(vals):
            ax.annotate(f"{v:.3g}", (i, v), ha="center", va="bottom", fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(title)
    return run.savefig(fig, name)


def print_table(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    rows = [[_fmt(c) for c in row] for row in rows]
    widths = [max([len(str(h))] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def _fmt(x: object) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}"
    return str(x)
