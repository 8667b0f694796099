"""Chat templates: render OpenAI-style messages into the model's prompt text with Jinja.

The GGUF's own template is used when it has one. The embedded Gemma 3 270M GGUF carries
none, so Gemma 3's official template (text-only) ships here for gemma3 models.

Before the template, ``normalize`` makes the common OpenAI layouts fit templates that want a
single leading system turn and alternating roles (Gemma's raises otherwise): every system
message joins one leading system turn, and consecutive turns of one role merge into one (the
contents joined with a blank line).

Role injection: a message's content is the user's text, never markup. ``render_parts`` keeps
the two apart so that only the template's own markers are tokenized as special tokens; a
"<end_of_turn>" typed by a user stays plain text.
"""

from __future__ import annotations

import re
from importlib.resources import files
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    pass


Part = tuple[str, bool]  # (text, is the template's markup: parse special tokens in it)
# a message's content stands in as NUL, index, NUL (NUL is refused in content and in
# chat_template_kwargs: core/protocol.py, core/chat_extras.py; so no request can forge one),
# padded with a space each side to see whether the template trims
_MARK = re.compile(r"( ?)\x00(\d+)\x00( ?)")


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


TURN_JOIN = "\n\n"


def normalize(messages: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The messages as one leading system turn (all system contents, in order; none if no
    system message) and then the other turns, consecutive turns of one role merged."""
    system = [c for r, c in messages if r == "system"]
    out: list[tuple[str, str]] = [("system", TURN_JOIN.join(system))] if system else []
    for role, content in messages:
        if role == "system":
            continue
        if out and out[-1][0] == role:
            out[-1] = (role, out[-1][1] + TURN_JOIN + content)
        else:
            out.append((role, content))
    return out


def builtin_template(architecture: str | None) -> str | None:
    """The shipped template for a model architecture without one in its GGUF."""
    if architecture == "gemma3":
        return files("uma_serve.core").joinpath("templates/gemma3.jinja").read_text()
    return None


class ChatTemplate:
    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        self.source = source
        try:
            self._template = env.from_string(source)
        except TemplateError as exc:
            raise ChatTemplateError(f"the chat template does not compile: {exc}") from None
        # BOS is added by the tokenizer, so the rendered text must not carry it again.
        self._bos, self._eos = bos_token, eos_token

    def render_parts(
        self, messages: list[tuple[str, str]], extra: dict[str, Any] | None = None
    ) -> list[Part]:
        """The prompt as the template's markup and the messages' contents, in order;
        ``extra``: the request's ``chat_template_kwargs``, more variables for the template.

        Nothing is dropped silently: a system-only chat, which a template that folds the
        system text into the first user turn (Gemma's) has no place for, is rendered as the
        user's turn (as llama.cpp's templates do for a model without a system role); any
        other content the template leaves out is a ChatTemplateError."""
        parts, missing = self._parts(messages, extra)
        if missing and all(role == "system" for role, _ in messages):
            parts, missing = self._parts([("user", content) for _, content in messages], extra)
        if missing:
            role = messages[missing[0]][0]
            raise ChatTemplateError(
                f"the chat template leaves out the content of a {role!r} message"
            )
        return parts

    def _parts(
        self, messages: list[tuple[str, str]], extra: dict[str, Any] | None = None
    ) -> tuple[list[Part], list[int]]:
        """The parts, and the messages whose content does not appear in them: the template
        is rendered with a placeholder for each content, then each placeholder is replaced
        by its content (trimmed on the sides the template trimmed)."""
        marked = self.render(
            [(role, f" \x00{i}\x00 ") for i, (role, _) in enumerate(messages)], extra
        )
        parts: list[Part] = []
        seen: set[int] = set()
        pos = 0
        for m in _MARK.finditer(marked):
            seen.add(index := int(m.group(2)))
            content = messages[index][1]
            if not m.group(1):
                content = content.lstrip()
            if not m.group(3):
                content = content.rstrip()
            parts += [(marked[pos : m.start()], True), (content, False)]
            pos = m.end()
        parts.append((marked[pos:], True))
        missing = [i for i in range(len(messages)) if i not in seen]
        return [(text, markup) for text, markup in parts if text], missing

    def render(self, messages: list[tuple[str, str]], extra: dict[str, Any] | None = None) -> str:
        """The template's text; ``extra`` adds variables (``enable_thinking``...) or replaces
        the defaults (``add_generation_prompt``), never ``messages``: as vLLM and llama-server
        pass ``chat_template_kwargs``."""
        context: dict[str, Any] = {
            "add_generation_prompt": True,
            "bos_token": "",
            "eos_token": self._eos,
            **(extra or {}),
            "messages": [{"role": r, "content": c} for r, c in messages],
        }
        try:
            return self._template.render(**context)
        except ChatTemplateError:
            raise
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from None
