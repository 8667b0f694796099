"""`bench floor` on the embedded model: it runs end to end, and each of its forms outputs what
it says (the device's top-k, whole logits rows, nothing; the top-k drawn as a request's defaults
ask, or greedy, each drawn token the next decode's)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import llama_cpp as ll
import numpy as np
import pytest

from uma_serve.bench import floor
from uma_serve.core.config import default_model_path
from uma_serve.core.runtime import Runtime, RuntimeParams

BENCH = str(Path(sys.executable).parent / "bench")


def test_floor_runs_and_writes_each_form(tmp_path: Path) -> None:
    args = ["floor", "--levels", "1,3", "--ticks", "4", "--rounds", "2", "--n-ctx", "2048"]
    proc = subprocess.run(
        [BENCH, *args, "--out", str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    s = json.loads(next(tmp_path.glob("floor-*/summary.json")).read_text())
    assert s["meta"]["scenario"] == "floor" and s["ticks"] == 4
    assert set(s["levels"]) == {"1", "3"}
    for forms in s["levels"].values():
        assert set(forms) == set(floor.FORMS)
        for form in forms.values():
            assert len(form["ms"]) == 2 and min(form["ms"]) > 0 and form["tok_s"] > 0
    assert "top-k" in proc.stdout and "summary:" in proc.stdout


def test_floor_refuses_a_context_too_small(tmp_path: Path) -> None:
    args = ["floor", "--levels", "4", "--ticks", "600", "--n-ctx", "1024"]
    proc = subprocess.run(
        [BENCH, *args, "--out", str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0 and "cells a sequence" in proc.stderr


@pytest.fixture(scope="module")
def runtime() -> Iterator[Runtime]:
    rt = Runtime(
        RuntimeParams(
            default_model_path(), n_ctx=1024, n_seq=3, device_top_k=64, max_outputs_per_seq=1
        )
    )
    yield rt
    rt.close()


@pytest.mark.parametrize("form", floor.FORMS)
def test_each_form_outputs_what_it_says(runtime: Runtime, form: str) -> None:
    prompt = runtime.tokenize("The capital of France is")
    pos = floor.start_form(runtime, 3, form, prompt)
    draws = floor.drawer(runtime, 3, form)
    rows = floor.tick(runtime, 3, pos, form)
    if form == "none":
        assert rows == [-1, -1, -1]
        return
    assert sorted(rows) == [0, 1, 2]
    if isinstance(draws, floor.DeviceDraws):
        check_device_draws(runtime, draws, rows, pos, prompt)
        return
    kept = [ll.llama_get_sampled_candidates_count_ith(runtime.ctx, row) for row in rows]
    top_k = form != "rows"
    assert kept == ([64] * 3 if top_k else [0] * 3)  # the device's top-k ran or not
    if top_k:
        ids, logits = runtime.candidates(rows)
        assert ids.shape == (3, 64) and np.isfinite(logits).all()
        assert ((ids >= 0) & (ids < runtime.n_vocab)).all()
        ids, logits = ids.copy(), logits.copy()  # the draw reads the candidates again
    if draws is not None:
        draws.draw(rows)
        for s, token in enumerate(draws.tokens):  # each row's own candidates, the chain's cut
            order = ids[s][np.argsort(-logits[s], kind="stable")]
            assert token in (order[:1] if form == "greedy" else order[:40]).tolist()
        assert draws.tokens != [floor.PROMPT_TOKENS + s for s in range(3)]
        assert floor.tick(runtime, 3, pos + 1, form, draws.tokens) == rows  # fed back
    elif not top_k:
        for row in rows:
            full = runtime.logits_row(row)
            assert full.shape == (runtime.n_vocab,) and np.isfinite(full).all()


def check_device_draws(
    runtime: Runtime, draws: floor.DeviceDraws, rows: list[int], pos: int, prompt: list[int]
) -> None:
    """The device form: each row's token is one its chain kept (at most the request's top-k
    of 40, min-p's cut), read back and fed to the next decode; the next form's start gives
    the sequences their top-k chains back."""
    draws.draw(rows)
    for row, token in zip(rows, draws.tokens, strict=True):
        n = ll.llama_get_sampled_candidates_count_ith(runtime.ctx, row)
        kept = ll.llama_get_sampled_candidates_ith(runtime.ctx, row)[:n]
        assert 0 < n <= 40 and token in kept
    assert draws.tokens != [floor.PROMPT_TOKENS + s for s in range(3)]
    assert floor.tick(runtime, 3, pos + 1, "device", draws.tokens) == rows  # fed back
    pos = floor.start_form(runtime, 3, "top-k", prompt)
    rows = floor.tick(runtime, 3, pos, "top-k")
    assert [ll.llama_get_sampled_candidates_count_ith(runtime.ctx, r) for r in rows] == [64] * 3
