"""Forgiving chat through the real openai SDK, gateway and daemon: the message layouts clients
send (system + developer, two system messages, same-role turns in a row, tool turns) are
normalized before the template; what a template still refuses is a 400 naming ``messages``;
``umad --chat-template FILE`` replaces the model's template."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from .gateway_helpers import Gateway, start_gateway
from .helpers import VENV_BIN, Daemon, start_daemon

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'},
}
LAYOUTS = {
    "system and developer": [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": "Answer in English."},
        {"role": "user", "content": "Hi"},
    ],
    "two system messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Hi"},
    ],
    "two user messages in a row": [
        {"role": "user", "content": "Hi"},
        {"role": "user", "content": [{"type": "text", "text": "How"},
                                     {"type": "text", "text": "are you?"}]},
    ],
    "a system message late": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Bye"},
    ],
    "a tool call and its result": [
        {"role": "user", "content": "What time is it?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ],
    "two results, then a user turn": [
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL, {**CALL, "id": "call_2"}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
        {"role": "tool", "tool_call_id": "call_2", "content": "13:00"},
        {"role": "user", "content": "Thanks"},
    ],
}  # fmt: skip


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_common_layouts_are_accepted(sdk, model_id, name) -> None:
    r = sdk.chat.completions.create(model=model_id, messages=LAYOUTS[name], max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0


def test_a_layout_the_template_refuses_is_a_400_naming_messages(sdk, model_id) -> None:
    messages = [{"role": "assistant", "content": "I speak first"}]
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model=model_id, messages=messages, max_tokens=2)
    error = info.value.body
    assert error["param"] == "messages" and error["code"] == "invalid_value", error
    assert "chat template" in error["message"]


@pytest.mark.parametrize("role", ["system", "developer"])
def test_a_chat_of_one_system_message_reaches_the_model(sdk, model_id, role) -> None:
    """Gemma's template folds the system text into the first user turn: with no user turn
    it dropped it (4 prompt tokens); it is now the user's turn, as llama.cpp renders it for
    templates without a system role."""
    text = "Write one word about the sea."
    alone = [{"role": role, "content": text}]
    got = sdk.chat.completions.create(model=model_id, messages=alone, max_tokens=1)
    as_user = [{"role": "user", "content": text}]
    want = sdk.chat.completions.create(model=model_id, messages=as_user, max_tokens=1)
    assert got.usage.prompt_tokens == want.usage.prompt_tokens > 4


PLAIN = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def plain_template(tmp_path_factory) -> Iterator[tuple[Daemon, Gateway]]:
    tmp: Path = tmp_path_factory.mktemp("template")
    (tmp / "plain.jinja").write_text(PLAIN)
    daemon = start_daemon(tmp, "--n-ctx", "1024", "--chat-template", str(tmp / "plain.jinja"))
    gw = start_gateway(daemon.socket, log_dir=tmp)
    yield daemon, gw
    gw.stop()
    daemon.stop()


def test_chat_template_file_replaces_the_models(plain_template) -> None:
    _, gw = plain_template
    sdk = gw.client()
    model = sdk.models.list().data[0].id
    text = "The quick brown fox"
    chat = sdk.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], max_tokens=1
    )
    plain = sdk.completions.create(model=model, prompt=text, max_tokens=1)
    # the template renders the content alone: the same tokens as the bare prompt
    assert chat.usage.prompt_tokens == plain.usage.prompt_tokens


def test_a_chat_template_that_does_not_compile_stops_umad_at_once(tmp_path) -> None:
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for %}")
    sock = str(tmp_path / "uma.sock")
    cmd = [str(VENV_BIN / "umad"), "--socket", sock, "--chat-template", str(bad)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "does not compile" in done.stderr
    assert "Traceback" not in done.stderr
