"""Chat templates: render OpenAI-style messages into the model's prompt text with Jinja.

The GGUF's own template is used when it has one. The embedded Gemma 3 270M GGUF carries
none, so Gemma 3's official template (text-only) ships here for gemma3 models.
"""

from __future__ import annotations

from importlib.resources import files

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    pass


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


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
        self._template = env.from_string(source)
        # BOS is added by the tokenizer, so the rendered text must not carry it again.
        self._bos, self._eos = bos_token, eos_token

    def render(self, messages: list[tuple[str, str]]) -> str:
        try:
            return self._template.render(
                messages=[{"role": r, "content": c} for r, c in messages],
                add_generation_prompt=True,
                bos_token="",
                eos_token=self._eos,
            )
        except ChatTemplateError:
            raise
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from None
