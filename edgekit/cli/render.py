"""How the CLI shows text: names are data, never markup, never terminal controls.

Every console the CLI prints on is a ``SafeConsole``: it never reads rich markup or emoji
codes in a string (a name with ``[/bold]`` is shown as ``[/bold]`` and cannot raise a
MarkupError), and it removes control characters from every piece of text it writes, so
nothing a renderable holds can move the cursor, retitle the terminal or open a link;
only rich's own styles and cursor controls reach the terminal.

Style comes from ``Text`` pieces: ``line(("error:", "bold red"), " ", text(message))``.
``name`` and ``text`` make a name or a message one clean line (``clean_text``: control and
bidi characters become ``?``, a very long name is cut), for tables, titles and messages.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.segment import Segment
from rich.text import Text

from edgekit.terminal_text import strip_controls
from edgekit.untrusted import clean_text

#: Longest name shown (model, bundle, variant, profile, file names); longer are cut.
NAME_MAX = 200
#: Longest message, hint, path or detail shown.
TEXT_MAX = 2000


class SafeConsole(Console):
    """A rich Console that reads no markup or emoji codes and writes no control
    characters but its own styles and cursor controls."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("highlight", False)
        super().__init__(markup=False, emoji=False, **kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        # No caller may turn markup back on for a string: names reach here in f-strings.
        kwargs["markup"] = False
        kwargs["emoji"] = False
        return super().render_str(text, **kwargs)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        # The one place every rendered piece of text passes before it is written: clean
        # it there, so that no renderable (a Text built anywhere, a traceback's message)
        # can carry an escape sequence out. Control segments are rich's own cursor moves.
        cleaned = (
            seg if seg.control else Segment(strip_controls(seg.text), seg.style, seg.control)
            for seg in buffer
        )
        return super()._render_buffer(cleaned)


def console(*, stderr: bool = False) -> SafeConsole:
    """A console on stdout (or stderr) that resolves the stream when it writes."""
    return SafeConsole(stderr=stderr)


def name(value: object, style: str = "", *, max_len: int = NAME_MAX) -> Text:
    """A name read from a file (model, bundle, variant, profile, file name) as one line of
    plain ``Text``."""
    return Text(clean_text(value, max_len=max_len), style=style)


def text(value: object, style: str = "", *, max_len: int = TEXT_MAX) -> Text:
    """A message, hint, path or detail as one line of plain ``Text``."""
    return Text(clean_text(value, max_len=max_len), style=style)


def line(*parts: str | Text | tuple[str, str]) -> Text:
    """One line from pieces: a ``Text`` as it is (made by ``name``/``text``), a
    ``(literal, style)`` pair, or a plain string; strings are cleaned, never parsed."""
    out = Text()
    for part in parts:
        if isinstance(part, Text):
            out.append_text(part)
        elif isinstance(part, tuple):
            out.append(clean_text(part[0], max_len=TEXT_MAX), style=part[1])
        else:
            out.append(clean_text(part, max_len=TEXT_MAX))
    return out
