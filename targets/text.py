"""Target-independent text handling: stop strings, UTF-8 across tokens, chat templates.

Chat templates come from model files, so they are untrusted input: they are rendered in
Jinja's immutable sandbox, which refuses attribute access to internals and mutation.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from edgekit.errors import GenerationError


class StopMatcher:
    """Cuts generated text at the first stop string, holding back any tail that could
    still turn into one (so a stream never shows half of a stop string)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Text safe to emit now, and whether a stop string was reached."""
        buf = self.held + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.held = ""
            return buf[: min(hits)], True
        keep = max((_overlap(buf, s) for s in self.stops), default=0)
        self.held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``stop``."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0


class Utf8Stream:
    """Decodes token bytes incrementally: a character split across tokens is emitted
    once complete, never as replacement characters."""

    def __init__(self) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self.decoder.decode(data)

    def flush(self) -> str:
        return self.decoder.decode(b"", final=True)


def render_chat_template(
    template: str, messages: Sequence[dict[str, str]], *, bos_token: str, eos_token: str
) -> str:
    """Apply a model's Jinja chat template in a sandbox.

    Raises:
        GenerationError: the template is invalid or raises (``raise_exception``).
    """
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise GenerationError(f"the chat template refused the messages: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    context: dict[str, Any] = {
        "messages": list(messages),
        "add_generation_prompt": True,
        "bos_token": bos_token,
        "eos_token": eos_token,
    }
    try:
        return env.from_string(template).render(**context)
    except TemplateError as exc:
        raise GenerationError(
            f"the model's chat template failed: {exc}",
            hint="pass a prompt to generate() instead, or fix the template in the model",
        ) from exc
