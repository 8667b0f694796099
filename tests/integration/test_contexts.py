"""umad with the model in two llama.cpp contexts (--contexts 2), on the CPU: requests sent
together all complete (their texts are not compared with one context's: batches of other
shapes round differently), the daemon reports every context's sequences and cells, a
conversation's next turn reuses its history from the context that holds it while other
requests arrive, and nothing is left behind."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from uma_serve.core import protocol as p

from .helpers import gen, start_daemon, wait_idle

PROMPTS = [
    "The three laws of motion are",
    "Once upon a time, there was a",
    "def fibonacci(n):",
    "The capital of France is",
]


def texts(daemon, reqs: list[p.Generate]) -> list[str]:
    def one(req: p.Generate) -> str:
        with daemon.client() as c:
            end = c.complete(req)
        assert isinstance(end, p.CompletionEvent), end
        assert end.usage.completion_tokens == req.max_tokens or end.reason == "stop"
        return end.text

    with ThreadPoolExecutor(len(reqs)) as pool:
        return list(pool.map(one, reqs))


def test_two_contexts_serve_every_request(tmp_path) -> None:
    reqs = [gen(pr, max_tokens=16, stream=False, ignore_eos=True) for pr in PROMPTS]
    two = start_daemon(tmp_path, "--n-seq", "4", "--n-ctx", "4096", "--contexts", "2")
    try:
        assert "2 contexts of the model" in two.log()
        with two.client() as c:
            info = c.info()
        assert (info.n_seq, info.n_ctx, info.n_ctx_per_seq) == (4, 4096, 1024)
        assert all(texts(two, reqs))
        m = wait_idle(two)
        assert (m["active_sessions"], m["kv_cells_used"], m["kv_cells_total"]) == (0, 0, 4096)
        # a conversation: its second turn re-sends the first with the answer
        first = gen("A story about a cat: the cat", max_tokens=12, stream=False)
        [answer] = texts(two, [first])
        hits = wait_idle(two)["prefix_cache_cached_tokens_total"]
        # the turn runs (its first token out) while three more requests arrive and spread
        turn = gen(first.prompt + answer + " Then the dog", max_tokens=24, ignore_eos=True)
        with two.client() as c:
            events = c.stream(turn)
            assert isinstance(next(events), p.TokenEvent)
            assert all(texts(two, [gen(pr, max_tokens=8, stream=False) for pr in PROMPTS[:3]]))
            assert isinstance(list(events)[-1], p.EosEvent)
        assert wait_idle(two)["prefix_cache_cached_tokens_total"] >= hits + 12
    finally:
        assert two.stop() == 0
    assert "Traceback" not in two.log()
