"""The gateway through the real openai SDK: completions and chat, streamed and not."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from uma_serve.core.config import default_model_path
from uma_serve.core.runtime import Runtime, RuntimeParams

from .gateway_helpers import core_metrics, wait_idle

pytestmark = pytest.mark.integration

PROMPT = "The capital of France is"
CHAT = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "Name a color."},
]


def test_models_list(sdk, umad):
    models = sdk.models.list()
    assert len(models.data) == 2  # the model's id, then its file's stem (test_gateway_models.py)
    card = models.data[0]
    assert card.object == "model" and card.owned_by == "uma-serve" and card.id
    assert sdk.models.retrieve(card.id).id == card.id


def test_completion_whole(sdk, model_id):
    r = sdk.completions.create(model=model_id, prompt=PROMPT, max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.model == model_id
    choice = r.choices[0]
    assert choice.index == 0 and choice.text
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_default_max_tokens_is_16(sdk, model_id):
    """OpenAI's default for /v1/completions; ignore_eos: the answer runs to the limit."""
    r = sdk.completions.create(
        model=model_id, prompt="Count: 1, 2, 3,", temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length"


def test_completion_stream_matches_whole(sdk, model_id):
    kw = dict(model=model_id, prompt=PROMPT, max_tokens=8, temperature=0)
    whole = sdk.completions.create(**kw)
    chunks = list(sdk.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text_chunks = [c for c in chunks if c.choices]
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in text_chunks) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in text_chunks][:-1] == [None] * (len(text_chunks) - 1)
    assert text_chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_stream_without_usage(sdk, model_id):
    chunks = list(
        sdk.completions.create(model=model_id, prompt=PROMPT, max_tokens=4, stream=True, seed=3)
    )
    assert chunks and all(c.choices for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_completion_list_of_one_prompt_and_echo(sdk, model_id):
    kw = dict(model=model_id, max_tokens=4, temperature=0)
    plain = sdk.completions.create(prompt=PROMPT, **kw)
    echoed = sdk.completions.create(prompt=[PROMPT], echo=True, **kw)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    streamed = sdk.completions.create(prompt=PROMPT, echo=True, stream=True, **kw)
    assert "".join(c.choices[0].text for c in streamed) == echoed.choices[0].text


def test_completion_seed_is_reproducible(sdk, model_id):
    kw = dict(model=model_id, prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=42)
    assert (
        sdk.completions.create(**kw).choices[0].text == sdk.completions.create(**kw).choices[0].text
    )


def test_chat_whole(sdk, model_id):
    r = sdk.chat.completions.create(model=model_id, messages=CHAT, max_tokens=8, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    msg = r.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 8


def test_chat_max_completion_tokens(sdk, model_id):
    r = sdk.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Write a long story about a dragon."}],
        max_completion_tokens=3,
        temperature=0,
    )
    assert r.usage.completion_tokens <= 3
    assert r.choices[0].finish_reason in ("stop", "length")


def test_chat_stream_role_first_then_content(sdk, model_id):
    kw = dict(model=model_id, messages=CHAT, max_tokens=8, temperature=0)
    whole = sdk.chat.completions.create(**kw)
    chunks = list(
        sdk.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    choices = [c.choices[0] for c in chunks if c.choices]
    text = "".join(ch.delta.content or "" for ch in choices)
    assert text == whole.choices[0].message.content
    assert choices[-1].finish_reason == whole.choices[0].finish_reason
    assert all(ch.finish_reason is None for ch in choices[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens


@pytest.fixture(scope="module")
def vocab() -> Iterator[Runtime]:
    """The model's tokenizer, to name token ids in logit_bias."""
    rt = Runtime(RuntimeParams(default_model_path(), n_ctx=256, n_seq=1))
    yield rt
    rt.close()


def test_logit_bias_forces_and_bans_tokens(sdk, model_id, vocab):
    (banana,) = vocab.tokenize(" banana", add_special=False)
    piece = vocab.piece(banana).decode()
    kw = dict(model=model_id, max_tokens=4, temperature=0)
    forced = {str(banana): 100}
    r = sdk.completions.create(prompt=PROMPT, logit_bias=forced, **kw)
    assert r.choices[0].text == piece * 4
    r = sdk.chat.completions.create(messages=CHAT, logit_bias=forced, **kw)
    assert r.choices[0].message.content == piece * 4
    stream = sdk.completions.create(prompt=PROMPT, logit_bias=forced, stream=True, **kw)
    assert "".join(ch.choices[0].text for ch in stream if ch.choices) == piece * 4
    # ban the greedy first token: the answer changes
    plain = sdk.completions.create(prompt=PROMPT, **kw).choices[0].text
    first = vocab.tokenize(plain, add_special=False)[0]
    banned = sdk.completions.create(prompt=PROMPT, logit_bias={str(first): -100}, **kw)
    assert banned.choices[0].text != plain
    assert not banned.choices[0].text.startswith(vocab.piece(first).decode())


def test_logprobs_completions_and_chat(sdk, model_id):
    kw = dict(model=model_id, max_tokens=4, temperature=0)
    r = sdk.completions.create(prompt=PROMPT, logprobs=2, **kw)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text
    assert len(lp.token_logprobs) == r.usage.completion_tokens
    for top, value in zip(lp.top_logprobs, lp.token_logprobs, strict=True):
        assert len(top) == 2 and max(top.values()) == pytest.approx(value) and value <= 0
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(len(lp.tokens))]
    stream = sdk.completions.create(prompt=PROMPT, logprobs=2, stream=True, **kw)
    streamed = [
        t
        for ch in stream
        if ch.choices and ch.choices[0].logprobs
        for t in ch.choices[0].logprobs.tokens
    ]
    assert streamed == lp.tokens
    r = sdk.chat.completions.create(messages=CHAT, logprobs=True, top_logprobs=3, **kw)
    content = r.choices[0].logprobs.content
    assert "".join(e.token for e in content) == r.choices[0].message.content
    for e in content:
        assert bytes(e.bytes).decode() == e.token and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].token == e.token and e.logprob <= 0
    stream = sdk.chat.completions.create(messages=CHAT, logprobs=True, stream=True, **kw)
    entries = [
        e
        for ch in stream
        if ch.choices and ch.choices[0].logprobs
        for e in ch.choices[0].logprobs.content
    ]
    assert [e.token for e in entries] == [e.token for e in content]
    assert all(e.top_logprobs == [] for e in entries)  # top_logprobs unset: none
    assert sdk.chat.completions.create(messages=CHAT, **kw).choices[0].logprobs is None


def test_n_choices_whole_and_streamed(sdk, model_id, vocab):
    """n > 1: n core requests, one answer; a +100 bias makes every choice's text known."""
    (banana,) = vocab.tokenize(" banana", add_special=False)
    forced = {str(banana): 100}
    piece = vocab.piece(banana).decode()
    kw = dict(model=model_id, max_tokens=3, logit_bias=forced, temperature=0.9, seed=3)
    r = sdk.completions.create(prompt=PROMPT, n=3, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.text == piece * 3 and c.finish_reason == "length" for c in r.choices)
    one = sdk.completions.create(prompt=PROMPT, **kw)
    assert r.usage.prompt_tokens == one.usage.prompt_tokens  # the shared prompt counts once
    assert r.usage.completion_tokens == 9 and r.usage.total_tokens == one.usage.prompt_tokens + 9
    r = sdk.chat.completions.create(messages=CHAT, n=2, **kw)
    assert [(c.index, c.message.content) for c in r.choices] == [(0, piece * 3), (1, piece * 3)]
    # streamed: chunks carry their choice's index; each choice opens with the role and ends
    # with its finish reason; one usage chunk, after every choice.
    stream = sdk.chat.completions.create(
        messages=CHAT, n=3, stream=True, stream_options={"include_usage": True}, **kw
    )
    chunks = list(stream)
    texts, roles, ends = {}, {}, {}
    for ch in chunks[:-1]:
        assert len(ch.choices) == 1 and ch.usage is None
        c = ch.choices[0]
        texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
        if c.delta.role:
            roles[c.index] = c.delta.role
            assert c.index not in texts or texts[c.index] == (c.delta.content or "")
        if c.finish_reason:
            ends[c.index] = c.finish_reason
    assert texts == {0: piece * 3, 1: piece * 3, 2: piece * 3}
    assert roles == {0: "assistant", 1: "assistant", 2: "assistant"}
    assert ends == {0: "length", 1: "length", 2: "length"}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 9
    stream = sdk.completions.create(prompt=PROMPT, n=2, stream=True, echo=True, **kw)
    texts = {}
    for ch in stream:
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {0: PROMPT + piece * 3, 1: PROMPT + piece * 3}


def test_n_choices_sampled_differ_and_errors_before_a_token(sdk, model_id):
    r = sdk.completions.create(
        model=model_id, prompt="Once upon a time", max_tokens=12, n=4, temperature=1.0, seed=9
    )
    assert len({c.text for c in r.choices}) > 1  # seeds seed+i: the choices are not copies
    with pytest.raises(openai.BadRequestError) as err:  # every choice refused: one 400
        sdk.completions.create(model=model_id, prompt="word " * 5000, max_tokens=4, n=2)
    assert err.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as err:
        sdk.completions.create(model=model_id, prompt="hi", max_tokens=4, n=17, stream=True)
    assert err.value.param == "n"


def test_chat_stop_sequence_and_qos(gateway, umad, model_id):
    """With the greedy answer's second word as ``stop`` (three characters from its middle
    when it has no second word), the same request's answer ends just before it, as "stop".
    Its X-UMA-QoS header reaches the core: its first token counts as background."""
    kw = dict(
        model=model_id,
        messages=[{"role": "user", "content": "List the numbers 1 to 10."}],
        max_tokens=24,
        temperature=0,
    )
    # sent once before, so this answer and the stopped one both find the prompt in the prefix
    # cache: the greedy answer differs with the cache ("1.1.2.3..." fresh, "1. 2. 3..." cached)
    wait_idle(umad.socket)
    gateway.client().chat.completions.create(**kw)
    client = gateway.client(default_headers={"X-UMA-QoS": "background"})
    before = ttft_counts(umad)
    # the greedy answer can still change between two sends (the rows' rounding follows how
    # the engine chunked and batched them, which follows its timing): a stopped answer that
    # neither stopped nor holds the stop came from another answer, and the pair is sent again
    sent = 0
    while sent < 3:
        sent += 1
        plain = gateway.client().chat.completions.create(**kw).choices[0].message.content
        words = plain.split()
        # the greedy answer may come without a space ("1.1.2.3.4..."), as the prefix cache
        # holds the prompt or not
        stop = words[1] if len(words) >= 2 else plain[len(plain) // 2 :][:3]
        assert len(plain) >= 6 and plain.index(stop) > 0, plain
        r = client.chat.completions.create(**kw, stop=[stop])
        content = r.choices[0].message.content
        if r.choices[0].finish_reason == "stop" or stop in content:
            break
    after = ttft_counts(umad)
    # the text before the stop word (the white space just before it may be tokenized
    # otherwise the second time, when the first answer's prompt comes from the prefix cache)
    assert stop not in content and r.choices[0].finish_reason == "stop"
    assert content.strip() == plain[: plain.index(stop)].strip()
    assert after["background"] == before["background"] + sent
    assert after["interactive"] == before["interactive"] + sent


def ttft_counts(umad) -> dict[str, int]:
    by_qos = core_metrics(umad.socket)["histograms_by_qos"]["ttft_ms"]
    return {q: h["count"] for q, h in by_qos.items()}


@pytest.mark.parametrize(
    ("label", "klass"),
    [
        ({}, "interactive"),
        ({"service_tier": "flex"}, "background"),
        ({"service_tier": "priority"}, "interactive"),
        ({"service_tier": "default"}, "interactive"),
        ({"priority": 5}, "background"),
        ({"priority": -1}, "interactive"),
        ({"qos": "background"}, "background"),
        ({"qos": "interactive", "service_tier": "flex"}, "interactive"),  # qos comes first
    ],
)
def test_labels_reach_the_core_as_its_classes(sdk, umad, model_id, label, klass):
    """OpenAI's service_tier and vLLM's priority are labels too (docs/GATEWAY.md); a short
    unlabeled prompt is a chat turn: its first token counts as interactive."""
    before = ttft_counts(umad)
    sdk.completions.create(model=model_id, prompt=PROMPT, max_tokens=2, extra_body=label)
    after = ttft_counts(umad)
    other = "background" if klass == "interactive" else "interactive"
    assert after[klass] == before[klass] + 1 and after[other] == before[other]


def test_a_long_unlabeled_prompt_counts_as_bulk(sdk, umad, model_id):
    """Over the interactive allowance (at most one batch of 512 tokens), a prompt is bulk."""
    before = ttft_counts(umad)
    doc = "The cat sat on the mat and looked at the garden. " * 60  # ~660 tokens
    # ignore_eos: a first token drawn as the end of text would end it with no token, no TTFT
    r = sdk.completions.create(
        model=model_id, prompt=doc, max_tokens=2, extra_body={"ignore_eos": True}
    )
    assert r.usage.prompt_tokens > 512 and r.usage.completion_tokens == 2
    assert ttft_counts(umad)["background"] == before["background"] + 1


def test_an_unknown_service_tier_is_refused(sdk, model_id):
    with pytest.raises(openai.BadRequestError) as err:
        sdk.completions.create(
            model=model_id, prompt=PROMPT, max_tokens=2, extra_body={"service_tier": "turbo"}
        )
    assert err.value.param == "service_tier"


def test_every_response_carries_a_request_id(gateway, sdk, model_id):
    raw = sdk.completions.with_raw_response.create(model=model_id, prompt=PROMPT, max_tokens=2)
    assert raw.headers["x-request-id"] == raw.parse().id
    with httpx.Client(timeout=30) as http:
        models = http.get(f"{gateway.base_url}/models")
        bad = http.post(f"{gateway.base_url}/completions", json={"prompt": "a", "n": 0})
        mine = http.get(f"{gateway.base_url}/models", headers={"X-Request-Id": "trace-42"})
    assert models.headers["x-request-id"].startswith("req-")
    assert bad.status_code == 400 and bad.headers["x-request-id"].startswith("req-")
    assert mine.headers["x-request-id"] == "trace-42"


def test_usage_reports_the_prefix_caches_hit(sdk, model_id):
    doc = "Here is a shared system prompt about harbors and boats and the sea. " * 12
    first = sdk.completions.create(model=model_id, prompt=doc + "One.", max_tokens=2)
    second = sdk.completions.create(model=model_id, prompt=doc + "Two.", max_tokens=2)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens_details is not None
    assert 0 < cached < second.usage.prompt_tokens
