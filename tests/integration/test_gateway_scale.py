"""Two real umad processes (one thread each) behind one real uma-gateway.

- Prefix affinity vs round robin: 8 concurrent multi-turn sessions; the share of prompt tokens
  the cores' prefix caches served (OpenAI's ``usage.prompt_tokens_details.cached_tokens``)
  is higher when a session keeps its core.
- kill -9 of one core under load: its streams that had started end with an error naming the
  core, its requests still waiting for their first token are answered by the other core, the
  other core's streams finish, and the restarted core takes its sessions back.
"""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai

from uma_serve.gateway.router import rank

from .gateway_helpers import VENV_BIN, Gateway, core_metrics, start_gateway
from .helpers import Daemon, start_daemon

CORE_ARGS = ("--threads", "1", "--n-ctx", "4096", "--seed", "1234")
SESSIONS, TURNS = 8, 4
WORDS = [
    "river",
    "stone",
    "lantern",
    "orchard",
    "copper",
    "meadow",
    "violin",
    "harbor",
    "glacier",
    "ember",
    "thistle",
    "canyon",
    "falcon",
    "pepper",
    "marble",
    "tunnel",
    "willow",
    "saddle",
    "quartz",
    "comet",
]  # noqa: SIM905


def start_cores(tmp: Path, *args: str) -> list[Daemon]:
    cores = []
    for name in ("a", "b"):
        (tmp / name).mkdir(parents=True, exist_ok=True)
        cores.append(start_daemon(tmp / name, *CORE_ARGS, *args))
    return cores


def gateway_over(cores: list[Daemon], *args: str) -> Gateway:
    extra = [a for d in cores[1:] for a in ("--core-socket", d.socket)]
    return start_gateway(cores[0].socket, *extra, *args, log_dir=Path(cores[0].socket).parent)


def document(i: int) -> str:
    rng = random.Random(i)
    sentences = [" ".join(rng.choices(WORDS, k=12)).capitalize() + "." for _ in range(8)]
    return f"Notebook {i}. " + " ".join(sentences)


def run_sessions(gw: Gateway, tag: str) -> tuple[float, float, int]:
    """8 concurrent conversations of TURNS turns each; returns (share of prompt tokens served
    from the prefix cache, share of turns after the first whose whole history, the previous
    turn's prompt at least, came from the cache, requests)."""
    client = gw.client()
    model = client.models.list().data[0].id
    totals = {"prompt": 0, "cached": 0, "later": 0, "later_hit": 0, "turns": 0}
    lock = threading.Lock()

    def session(i: int) -> None:
        # sessions 0-2 name themselves with X-Session-Id, 3-5 with OpenAI's `user`; 6-7 with
        # neither (their notebook, at the start of the prompt, keeps them on one core)
        headers = {"X-Session-Id": f"{tag}-{i}"} if i < 3 else {}
        user = {"user": f"{tag}-user-{i}"} if 3 <= i < 6 else {}
        messages = [
            {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
            {"role": "user", "content": f"{document(i)}\nSummarise it."},
        ]
        previous = 0
        for turn in range(TURNS):
            r = client.chat.completions.create(
                model=model,
                messages=messages,
                max_tokens=8,
                temperature=0,
                extra_headers=headers,
                **user,
            )
            usage = r.usage
            cached = usage.prompt_tokens_details.cached_tokens
            with lock:
                totals["prompt"] += usage.prompt_tokens
                totals["cached"] += cached
                totals["turns"] += 1
                if turn:
                    totals["later"] += 1
                    totals["later_hit"] += cached >= previous
            previous = usage.prompt_tokens
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
            messages.append({"role": "user", "content": f"And what about the {WORDS[turn]}?"})

    with ThreadPoolExecutor(SESSIONS) as pool:
        list(pool.map(session, range(SESSIONS)))
    return (
        totals["cached"] / totals["prompt"],
        totals["later_hit"] / totals["later"],
        totals["turns"],
    )


def test_prefix_affinity_beats_round_robin(fresh_tmp):
    rates = {}
    for routing in ("affinity", "round-robin"):
        cores = start_cores(fresh_tmp / routing, "--n-seq", "4")
        gw = gateway_over(cores, "--routing", routing)
        try:
            rates[routing] = run_sessions(gw, routing)
            text = httpx.get(f"{gw.url}/metrics").text
            print("\n" + "\n".join(x for x in text.splitlines() if "routed_requests_total{" in x))
            for d in cores:  # each core is labelled, and both took work
                assert f'uma_core_up{{core="{d.socket}"}} 1.0' in text
                assert core_metrics(d.socket)["prefix_cache_queries_total"] > 0
        finally:
            gw.stop()
            for d in cores:
                d.stop()
    for routing, (tokens, turns, n) in rates.items():
        print(f"\n{routing}: {tokens:.1%} of prompt tokens from the prefix cache, "
              f"{turns:.0%} of later turns found their history cached, {n} requests")  # fmt: skip
    assert rates["affinity"][0] > rates["round-robin"][0]


def keys_for(socket: str, sockets: list[str], n: int) -> list[str]:
    """Session keys whose first choice is ``socket`` (the gateway's own ranking)."""
    keys = (f"session-{i}" for i in range(10_000))
    return [k for k in keys if rank(b"s\x00" + k.encode(), sockets)[0] == socket][:n]


class StreamRun(threading.Thread):
    """One streamed completion in a thread: its core, its chunks, its end or its error."""

    def __init__(self, gw: Gateway, model: str, key: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.client, self.model, self.key, self.max_tokens = gw.client(), model, key, max_tokens
        self.first = threading.Event()
        self.core: str | None = None
        self.chunks = 0
        self.finish: str | None = None
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            raw = self.client.completions.with_raw_response.create(
                model=self.model,
                prompt=f"Tell a long story about {self.key}.",
                max_tokens=self.max_tokens,
                stream=True,
                extra_headers={"X-Session-Id": self.key},
                extra_body={"ignore_eos": True},
            )
            self.core = raw.headers.get("x-uma-core")
            for chunk in raw.parse():
                self.chunks += 1
                self.first.set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    self.finish = chunk.choices[0].finish_reason
        except Exception as exc:  # noqa: BLE001 (the test reads it)
            self.error = exc
        finally:
            self.first.set()


def wait_for(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_killed_core_fails_over_and_rejoins(fresh_tmp):
    cores = start_cores(fresh_tmp, "--n-seq", "2")
    a, b = cores
    sockets = [a.socket, b.socket]
    gw = gateway_over(cores, "--health-interval", "0.5")
    try:
        model = gw.client().models.list().data[0].id
        a_keys, b_keys = keys_for(a.socket, sockets, 4), keys_for(b.socket, sockets, 2)
        # two long streams on each core, all started (A's two sequences both busy)
        running = [StreamRun(gw, model, k, 400) for k in a_keys[:2]]
        running += [StreamRun(gw, model, k, 24) for k in b_keys]
        for run in running:
            run.start()
        for run in running:
            run.first.wait(120)
            assert run.error is None and run.core in (a.socket, b.socket), run.error
        assert [r.core for r in running] == [a.socket, a.socket, b.socket, b.socket]
        # two more for A: they wait in its queue, no token yet
        queued = [StreamRun(gw, model, k, 6) for k in a_keys[2:]]
        for run in queued:
            run.start()
        wait_for(lambda: core_metrics(a.socket)["waiting_sessions"] == 2, "A's queue")
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait(10)
        for run in running + queued:
            run.join(180)
            assert not run.is_alive()
        for run in running[:2]:  # started on A: a clear error after their first chunks
            assert run.chunks >= 1 and isinstance(run.error, openai.APIError), run.error
            assert "failed after the answer had started" in str(run.error)
            assert a.socket in str(run.error)
        for run in running[2:]:  # B's kept streaming to their end
            assert run.error is None and run.finish == "length", run.error
        for run in queued:  # no token yet when A died: answered by B
            assert run.error is None and run.finish == "length" and run.core == b.socket
        # while A is away its sessions are served by B, and /health says which core is down
        client = gw.client()
        r = client.completions.with_raw_response.create(
            model=model, prompt="Hi", max_tokens=2, extra_headers={"X-Session-Id": a_keys[0]}
        )
        assert r.headers["x-uma-core"] == b.socket
        health = httpx.get(f"{gw.url}/health").json()
        states = {c["core"]: c["status"] for c in health["cores"]}
        assert health["status"] == "ok" and states == {"core 0": "unavailable", "core 1": "ok"}
        assert a.socket not in str(health) and b.socket not in str(health)  # needs no key
        metrics = httpx.get(f"{gw.url}/metrics").text
        assert f'uma_core_up{{core="{a.socket}"}} 0.0' in metrics
        assert 'reason="retry"' in metrics
        # A restarts on its socket: it rejoins, and its sessions come back to it
        a = cores[0] = start_daemon(Path(a.socket).parent, *CORE_ARGS, "--n-seq", "2")
        wait_for(lambda: httpx.get(f"{gw.url}/health").json()["cores"][0]["status"] == "ok", "A")
        wait_for(
            lambda: (
                client.completions.with_raw_response.create(
                    model=model,
                    prompt="Hi",
                    max_tokens=2,
                    extra_headers={"X-Session-Id": a_keys[0]},
                ).headers["x-uma-core"]
                == a.socket
            ),
            "A's sessions back on A",
        )
    finally:
        gw.stop()
        for d in cores:
            if d.proc.poll() is None:
                d.stop()


def test_gateway_refuses_a_socket_given_twice():
    twice = ["--core-socket", "/x.sock", "--core-socket", "/x.sock"]
    out = subprocess.run([str(VENV_BIN / "uma-gateway"), *twice], capture_output=True, text=True)
    assert out.returncode == 2 and "given twice" in out.stderr
