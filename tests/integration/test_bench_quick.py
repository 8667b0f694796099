"""`bench <scenario> --quick` for every scenario against the real daemon and gateway: each run
writes its CSV, summary.json and PNG plots, with tokens counted and no failed requests.
`peers` runs on UMA + llama-server only when the peer build is already cached (never built
here: it takes minutes)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from uma_serve.bench import peers_build

BENCH = str(Path(sys.executable).parent / "bench")

# scenario -> (CSV it must write, summary keys that must count tokens)
SCENARIOS = {
    "solo": ("tokens.csv", ["output_tokens"]),
    "storm": ("tokens.csv", ["interactive.output_tokens", "solo.output_tokens"]),
    "chat-vs-paste": ("tokens.csv", ["interactive.output_tokens", "paste.output_tokens"]),
    "agent-chain": ("chain.csv", ["alone.output_tokens", "loaded.output_tokens"]),
    "mixed-load": ("tokens.csv", ["interactive.output_tokens", "background.output_tokens"]),
    "long-ctx": ("long_ctx.csv", ["max_ctx_tps"]),
    "sweep": ("sweep.csv", ["c1.output_tokens", "c4.output_tokens"]),
    "ipc-overhead": ("ipc_overhead.csv", ["socket.output_tokens", "gateway.output_tokens"]),
}


def get(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d[part]
    return d


def run_bench(out: Path, *args: str, timeout: int = 300) -> dict:
    proc = subprocess.run(
        [BENCH, *args, "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed"] == 0, summary.get("errors")
    assert list(out.glob("*.png")), "no plot written"
    for f in summary["files"]:
        assert (out / f).exists(), f
    return summary


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_bench_quick(scenario: str, tmp_path: Path) -> None:
    csv_name, token_keys = SCENARIOS[scenario]
    out = tmp_path / scenario
    extra = ("--rounds", "2") if scenario == "storm" else ()  # phases alternate, pooled
    summary = run_bench(out, scenario, *extra)
    with open(out / csv_name) as fh:
        rows = list(csv.reader(fh))
    assert len(rows) > 1, f"{csv_name} has no data rows"
    for key in token_keys:
        value = get(summary, key)
        assert value is not None and value > 0, (key, value)
    if scenario == "solo":
        assert 0 < summary["ttft_p50_ms"] < 10_000
        assert 0 < summary["itl_p50_ms"] < 2_000
        assert summary["ttf5_p50_ms"] >= summary["ttft_p50_ms"]
        card = json.loads((out / "scorecard.json").read_text())  # the server's side of the run
        assert card == summary["scorecard"]
        assert card["tick_count"] > 0 and card["ttft_count"] == summary["requests"]
        assert 0 < card["tick_p50_ms"] <= card["tick_p95_ms"] <= card["tick_p99_ms"]
        assert card["tokens_per_tick"] >= 1 and 0 < card["engine_idle_share"] < 1
        # the prompt's tick builds its graph; steady decode ticks reuse theirs
        assert 0 < card["graph_rebuild_share"] < 1
    if scenario == "storm":
        assert summary["background"]["completed"] > 0
        assert summary["ratio_to_solo"]["itl_p50_ms"] > 0
        slow = summary["slow_gaps"]
        assert slow["over_ms"] == round(2 * summary["solo"]["itl_p50_ms"], 3)
        assert all(0 <= slow[k] <= 1 for k in ("solo", "interactive", "solo_after_3"))
        rounds = summary["rounds"]
        assert rounds["n"] == 2 and len(rounds["itl_p95_ratio"]) == 2
        assert min(rounds["itl_p95_ratio"]) <= rounds["median"] <= max(rounds["itl_p95_ratio"])
        assert summary["solo"]["requests"] == 2 * 3  # storm's 3 requests a phase, pooled
    if scenario == "mixed-load":
        assert rows[0] == ["session_id", "token_idx", "ts_ms", "is_interactive"]
        assert summary["alone"]["output_tokens"] > 0
        assert summary["ratio_to_alone"]["itl_p95_ms"] > 0
    if scenario == "long-ctx":
        assert rows[0] == ["ctx", "tps", "itl_p95_ms"]
    if scenario == "ipc-overhead":
        assert rows[0] == ["path", "ttft_ms", "itl_ms", "cpu_ms_per_token"]
        assert {r[0] for r in rows[1:]} == {"socket", "gateway", "gateway-httpx"}


@pytest.mark.parametrize("agent", [False, True], ids=["chat", "agent"])
def test_bench_conversation_quick(agent: bool, tmp_path: Path) -> None:
    """Conversations re-send their history (an agent's with tool calls and results): the
    prefix cache serves most of each later turn, alone and under the storm."""
    out = tmp_path / "conversation"
    summary = run_bench(out, "conversation", "--rounds", "1", *(["--agent"] if agent else []))
    for phase in ("alone", "storm"):
        figures = summary[phase]
        assert figures["requests"] == 3 and figures["failed"] == 0
        assert set(figures["ttft_p50_ms_by_turn"]) == {"0", "1", "2"}
        assert figures["cached_share"] > 0.5, figures  # the history and the system prompt
    assert summary["background"]["completed"] > 0
    assert all(summary["ratio"][k] > 0 for k in ("ttft_p50", "itl_p95", "cached_share"))


def test_bench_peers_quick(tmp_path: Path) -> None:
    """UMA Serve and llama-server built from the same llama.cpp sources, in one run (`make
    test` builds the peer first)."""
    assert peers_build.llama_server_bin().exists(), (
        f"llama-server peer not built at {peers_build.llama_server_bin()}: "
        "python -m uma_serve.bench.peers_build llama-server"
    )
    out = tmp_path / "peers"
    summary = run_bench(
        out, "peers", "--servers", "uma,llama-server", "--scenarios", "solo,sweep", timeout=400
    )
    assert summary["servers"] == ["uma", "llama-server"], summary["unavailable"]
    for server in ("uma", "llama-server"):
        assert summary["results"]["solo"][server]["output_tokens"] > 0
        assert summary["results"]["sweep"][server]["c4"]["output_tok_per_s"] > 0
    assert (out / "peers.csv").exists() and (out / "sweep_frontier.png").exists()


def test_bench_grammar_mix_quick(tmp_path: Path) -> None:
    """The constrained side requests' answers parse; the four phases are measured, the
    matched one's side requests as long as the constrained answers."""
    out = tmp_path / "grammar-mix"
    proc = subprocess.run(
        [BENCH, "grammar-mix", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed"] == 0, summary.get("errors")
    assert summary["constrained_requests"] > 0
    assert summary["constrained_parsed"] == summary["constrained_complete"] > 0
    for key in ("alone_tok_per_s", "plain_tok_per_s", "mixed_tok_per_s", "matched_tok_per_s"):
        assert summary[key] > 0, key
    assert summary["mixed_over_plain"] > 0 and summary["beside_over_alone"] > 0
    assert summary["mixed_over_matched"] > 0
    lengths = summary["side_lengths"]
    assert lengths["matched"] and set(lengths["matched"]) <= set(lengths["constrained"])


def test_bench_calibrate_writes_the_bandwidth_and_the_model_facts(tmp_path: Path) -> None:
    """`bench calibrate` (what --bmt-budget is set from), one short point on the embedded
    model: its summary holds the GB/s it prints and the model's facts the guard reads."""
    summary = run_in_process(tmp_path, "calibrate", "--n-seq", "1", "--contexts", "64",
                             "--ticks", "2")  # fmt: skip
    assert summary["effective_gbs"] > 0
    assert summary["model_facts"]["weights_bytes"] > 0
    assert summary["model_facts"]["n_expert"] == 0  # Gemma 3 is dense


def test_bench_engine_runs_32_streams_of_120_tokens_with_its_default_context(
    tmp_path: Path,
) -> None:
    """`bench engine --n 32` sizes its KV for the streams it runs: with a fixed 4,096 cells,
    32 streams of 120 tokens found no memory slot and the bare loop died on an assert."""
    summary = run_in_process(tmp_path, "engine", "--n", "32", "--tokens", "120", "--rounds", "1")
    assert summary["n"] == 32 and summary["bare_median"] > 0 and summary["daemon_median"] > 0
    assert summary["n_ctx"] == 6144  # 32 x (120 + 64) = 5,888 cells, to a multiple of 1,024


def run_in_process(tmp_path: Path, scenario: str, *args: str) -> dict:
    """A scenario that loads the model in-process: its run succeeds, its one summary."""
    proc = subprocess.run(
        [BENCH, scenario, *args, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    (path,) = tmp_path.glob(f"{scenario}-*/summary.json")
    return json.loads(path.read_text())
