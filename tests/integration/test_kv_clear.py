"""Clearing a sequence id with the real model: each of llama.cpp's operations on a sequence's
cells passes over every cell of the context, so a clear skips the passes over an id known to
hold nothing. Whatever wrote the id's cells, a clear must still leave it, and its shadow,
empty: otherwise the next request on that id would attend to another's KV."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import llama_cpp
import pytest

from uma_serve.core.config import default_model_path
from uma_serve.core.runtime import Runtime, RuntimeParams, Span

TEXT = "The lighthouse keeper logs the weather every morning at six. " * 40
ID = 2  # the id written and cleared; sequence 0 holds the source cells


@pytest.fixture(scope="module")
def rt():
    params = RuntimeParams(
        default_model_path(),
        n_ctx=4096,
        n_seq=4,
        n_seq_cache=2,
        swa_full=True,
        shadow=True,
        launch_thread=True,
    )
    runtime = Runtime(params)
    tokens = runtime.tokenize(TEXT)[:300]
    assert runtime.decode([Span(0, 0, tokens, True)])[0] == 0
    yield runtime
    runtime.close()


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The seq ids of llama_memory_seq_rm calls (each a pass over every cell)."""
    calls: list[int] = []
    real = llama_cpp.llama_memory_seq_rm

    def counted(memory, seq_id, p0, p1):  # noqa: ANN001, ANN202
        calls.append(seq_id)
        return real(memory, seq_id, p0, p1)

    monkeypatch.setattr(llama_cpp, "llama_memory_seq_rm", counted)
    return calls


def _decode(rt: Runtime, tmp: Path) -> None:
    tokens = rt.tokenize(TEXT)[:280]  # past the shadow's lag: the shadow is tagged too
    assert rt.decode([Span(ID, 0, tokens, True)])[0] == 0


def _launch(rt: Runtime, tmp: Path) -> None:
    rt.launch([Span(ID, 0, rt.tokenize(TEXT)[:40], True)], on_thread=True)
    assert rt.synchronize() == 0


def _copy(rt: Runtime, tmp: Path) -> None:
    rt.seq_copy(0, ID, 200)


def _load(rt: Runtime, tmp: Path) -> None:
    tokens = rt.tokenize(TEXT)[:300]
    assert rt.seq_save(str(tmp / "seq0.kv"), 0, tokens)
    assert rt.seq_load(str(tmp / "seq0.kv"), ID, 400) == tokens


def _restore(rt: Runtime, tmp: Path) -> None:
    assert rt.seq_restore(ID, rt.seq_state(0))


WRITERS: dict[str, Callable[[Runtime, Path], None]] = {
    "decode": _decode,
    "launch": _launch,
    "copy": _copy,
    "load": _load,
    "restore": _restore,
}


@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_clear_empties_an_id_whatever_wrote_it(
    rt: Runtime, passes: list[int], tmp_path: Path, writer: str
) -> None:
    empty = len(rt.seq_state(3))  # an id never written
    shadow = ID + rt._n_ids
    rt.seq_clear(ID)
    passes.clear()
    rt.seq_clear(ID)  # cleared and not written since: no pass at all
    assert passes == []

    WRITERS[writer](rt, tmp_path)
    assert rt.seq_pos_max(ID) >= 0
    rt.seq_clear(ID)
    assert ID in passes
    assert len(rt.seq_state(ID)) == empty and len(rt.seq_state(shadow)) == empty
    assert rt.seq_pos_max(ID) == -1 and rt.seq_pos_max(shadow) == -1
    assert len(rt.seq_state(0)) > empty  # the source keeps its cells


def test_a_shadow_never_tagged_costs_no_pass(rt: Runtime, passes: list[int]) -> None:
    """A short sequence (fewer positions than the shadow's lag) leaves its shadow untagged:
    its clear passes over the id once, not over the shadow."""
    rt.seq_clear(ID)
    assert rt.decode([Span(ID, 0, rt.tokenize(TEXT)[:20], True)])[0] == 0
    passes.clear()
    rt.seq_clear(ID)
    assert passes == [ID]
    assert rt.seq_pos_max(ID) == -1
