"""The launch thread's hand-offs (core/runtime/launcher.py), with llama_decode replaced: each
launch's rc comes back once it returned, a failure reaches the caller, close ends the thread."""

from __future__ import annotations

import threading
import types

import pytest

from uma_serve.core.runtime import launcher as launcher_module
from uma_serve.core.runtime.launcher import Launcher


def test_each_launch_runs_on_the_thread_and_returns_its_rc(monkeypatch) -> None:
    seen: list[tuple[object, object, str]] = []
    release = threading.Event()

    def decode(ctx, batch):
        seen.append((ctx, batch, threading.current_thread().name))
        release.wait(5)  # the caller is not held up by a decode that computes
        return 7 if batch == "b2" else 0

    monkeypatch.setattr(launcher_module, "ll", types.SimpleNamespace(llama_decode=decode))
    launcher = Launcher()
    pending = launcher.start("ctx", "b1")
    assert seen and seen[0][:2] == ("ctx", "b1")  # begun before start returned
    release.set()
    assert pending.result() == 0
    assert launcher.start("ctx", "b2").result() == 7
    assert {name for _, _, name in seen} == {"uma-launch"}
    thread = launcher._thread
    launcher.close()
    assert thread is not None and not thread.is_alive()


def test_a_failed_launch_reaches_the_caller_and_the_thread_goes_on(monkeypatch) -> None:
    calls = iter([RuntimeError("boom"), 0])

    def decode(ctx, batch):
        out = next(calls)
        if isinstance(out, Exception):
            raise out
        return out

    monkeypatch.setattr(launcher_module, "ll", types.SimpleNamespace(llama_decode=decode))
    launcher = Launcher()
    with pytest.raises(RuntimeError, match="boom"):
        launcher.start("ctx", "b").result()
    assert launcher.start("ctx", "b").result() == 0
    launcher.close()
