"""`bench shared-prefix --quick` and `bench repetitive --quick` against the real daemon and
gateway: they run, count tokens, fail no request, and show the cache hits and identical text."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = str(Path(sys.executable).parent / "bench")


def run_bench(out: Path, *args: str) -> dict:
    proc = subprocess.run(
        [BENCH, *args, "--quick", "--out", str(out)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, (
        f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return json.loads((out / "summary.json").read_text())


def test_shared_prefix_quick(tmp_path: Path) -> None:
    s = run_bench(tmp_path / "sp", "shared-prefix", "--target", "uma-socket")
    assert s["failed"] == 0
    assert s["prefix_cache_hits"] >= 8 and s["prefix_cache_cached_tokens"] > 8 * 400
    assert s["ttft_warm_seq_p50_ms"] < s["ttft_cold_ms"]
    # the daemon's own times: admission before the first token, both inside the client's TTFT
    for phase in ("alone_seq", "warm_seq", "warm_conc"):
        queue, ttft = s[f"server_queue_{phase}_p50_ms"], s[f"server_ttft_{phase}_p50_ms"]
        assert 0 < queue <= ttft <= s[f"ttft_{phase}_p50_ms"]
    assert (tmp_path / "sp" / "ttft.csv").exists()


def test_repetitive_quick(tmp_path: Path) -> None:
    """Speculation leaves greedy text as it is: bit-identical under --deterministic (by
    default a verification batch's shape takes other CPU kernels, whose rounding may turn a
    near-tie; docs/MEMORY.md, "Reproducible greedy output")."""
    det = ["--umad-arg=--deterministic", "--umad-arg=on"]
    s = run_bench(tmp_path / "rep", "repetitive", *det)
    assert s["failed"] == 0 and s["identical_text"] is True
    assert s["spec_on"]["decode_tok_per_s"] > 0 and s["spec_off"]["decode_tok_per_s"] > 0


def test_warm_floor(tmp_path: Path) -> None:
    """In-process, no daemon: both prefills run and the model's shape is read from the GGUF."""
    args = ["warm-floor", "--rounds", "2", "--system-tokens", "600", "--out", str(tmp_path)]
    proc = subprocess.run([BENCH, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    s = json.loads(next(tmp_path.glob("warm-floor-*/summary.json")).read_text())
    assert s["cached_tokens"] > 400 and s["question_tokens"] > 10
    shape = s["shape"]  # Gemma 3 270M: 18 layers, every 6th global, a 512-position window
    assert (shape["n_layer"], shape["swa_layers"], shape["n_swa"]) == (18, 15, 512)
    assert shape["n_params"] > shape["n_vocab"] * shape["n_embd"]
    assert s["macs_extra"] > 0 and s["floor_arithmetic"] > 1.0
    assert len(s["decode_warm_ms"]) == 2 and min(s["decode_alone_ms"] + s["decode_warm_ms"]) > 0
