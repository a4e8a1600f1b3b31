"""Message text that must stay text.

Message text is data: ``protect_messages`` swaps every control token's text inside the
messages (``<|im_start|>`` in a user's content) for a marker before the template runs, and
``ProtectedMessages.pieces`` splits the rendered prompt at those markers, so a Session can
tokenize the forged text as plain text while the template's own control tokens stay
control tokens (docs/security.md).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgekit.errors import GenerationError


@dataclass(frozen=True)
class ProtectedMessages:
    """Messages whose control-token texts were swapped for markers, and how to undo it."""

    messages: list[dict[str, Any]]
    controls: tuple[str, ...]  # the control-token texts, by marker number
    marker: str  # every marker is f"{marker}{number}\ue001"
    forged: bool  # whether any message held a control-token text

    def pieces(self, rendered: str) -> list[tuple[str, bool]]:
        """``rendered`` split at the markers: (text, False) for what the template wrote
        (its control tokens are real) and (control text, True) for each forged one."""
        out: list[tuple[str, bool]] = []
        pattern = re.compile(re.escape(self.marker) + r"(\d+)\ue001")
        at = 0
        for match in pattern.finditer(rendered):
            out.append((rendered[at : match.start()], False))
            out.append((self.controls[int(match.group(1))], True))
            at = match.end()
        out.append((rendered[at:], False))
        return out


def protect_messages(
    messages: Sequence[Mapping[str, Any]], controls: Iterable[str]
) -> ProtectedMessages:
    """Swap every control-token text inside ``messages`` (every string they hold: roles,
    content, names, tool calls) for a marker the template passes through unchanged: a
    private-use character, digits and another private-use character, with a random part
    that appears nowhere in the messages (so a message cannot forge a marker either)."""
    texts = tuple(sorted({c for c in controls if c}, key=len, reverse=True))
    if not texts:
        return ProtectedMessages(
            messages=[dict(m) for m in messages], controls=(), marker="", forged=False
        )
    every = "\n".join(_all_strings(messages))
    marker = ""
    while not marker or marker in every:
        marker = f"\ue000{secrets.randbelow(10**12):012d}."
    find = re.compile("|".join(map(re.escape, texts)))
    number = {t: i for i, t in enumerate(texts)}
    forged = False

    def swap(value: Any) -> Any:
        nonlocal forged
        if isinstance(value, str):
            if find.search(value) is None:
                return value
            forged = True
            return find.sub(lambda m: f"{marker}{number[m.group()]}\ue001", value)
        if isinstance(value, Mapping):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [swap(v) for v in value]
        return value

    swapped = [swap(dict(m)) for m in messages]
    return ProtectedMessages(messages=swapped, controls=texts, marker=marker, forged=forged)


def _all_strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _all_strings(k)
            yield from _all_strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _all_strings(v)


def split_control_text(text: str, controls: Iterable[str]) -> list[str]:
    """``text`` (one control token's text) cut into pieces none of which contains a
    control token's text: for a tokenizer that always parses control tokens, encoding the
    pieces one by one gives the characters as plain text.

    Raises:
        GenerationError: a piece would have to be a single character that is itself a
            control token (no tokenizer would write it as text).
    """
    texts = [c for c in controls if c]
    pieces: list[str] = []
    rest = text
    while rest:
        cut = len(rest)  # the longest head of the rest that holds no control text
        while cut and any(c in rest[:cut] for c in texts):
            cut -= 1
        if not cut:
            raise GenerationError(
                f"a message contains {rest[0]!r}, a one-character control token of this "
                "model, which cannot be written as text",
                hint="remove it from the message",
            )
        pieces.append(rest[:cut])
        rest = rest[cut:]
    return pieces
