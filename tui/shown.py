"""How the TUI shows text from files: names are data, never Textual or rich markup.

Textual reads markup in every string it is given (a Static, a DataTable cell, a column
label, a Select prompt, a notification): ``[/bold]`` in a bundle name would raise a
MarkupError and take a worker (or the app) down, and ``[@click=app.quit]`` would be a
live action. So every string read from a file reaches a widget through here:

- ``content(template, **names)``: Textual markup written in this code, with ``$name``
  variables that Textual inserts as plain text (each name cleaned to one line);
- ``plain(name)``, ``plain_lines(lines)``: names or messages alone as Content;
- ``cell(name)``: a DataTable cell, column label or Select prompt (a rich ``Text``);
- ``output(text)``: a model's reply, newlines kept, escape sequences removed.

Notifications go out with ``markup=False`` and a cleaned message (``EdgekitApp.report``).
"""

from __future__ import annotations

from rich.text import Text
from textual.content import Content

from edgekit.terminal_text import clean_output
from edgekit.untrusted import clean_text

#: Longest name shown (model, bundle, variant, profile, file names).
NAME_MAX = 200
#: Longest message, path or detail shown.
TEXT_MAX = 2000


def content(template: str, **names: object) -> Content:
    """``template`` (markup of this code, with ``$key`` variables) with each name
    inserted as plain, cleaned text."""
    return Content.from_markup(
        template, **{k: clean_text(v, max_len=TEXT_MAX) for k, v in names.items()}
    )


def plain(value: object, *, max_len: int = TEXT_MAX) -> Content:
    """A name or message as plain Content, one line."""
    return Content(clean_text(value, max_len=max_len))


def plain_lines(lines: list[str]) -> Content:
    """Lines of text as plain Content: each cleaned to one line, the breaks between them
    kept."""
    return Content("\n".join(clean_text(line, max_len=TEXT_MAX) for line in lines))


def cell(value: object, *, max_len: int = NAME_MAX) -> Text:
    """A DataTable cell, column label or Select prompt: plain Text, one line (what the
    table makes of a string in a one-line row, without reading markup)."""
    return Text(clean_text(value, max_len=max_len), no_wrap=True, end="")


def output(text: str) -> str:
    """A model's reply as text to show: line breaks and tabs stay, terminal escape
    sequences and other control characters go (``edgekit.terminal_text``)."""
    return clean_output(text)
