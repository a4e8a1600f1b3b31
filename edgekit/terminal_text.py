"""Text edgekit shows on a terminal or writes to a log, made safe to show.

Three kinds of text reach a terminal, and each has one way through here:

- **Names** (a model, bundle, variant or profile name, a path, an error message): one
  line, ``edgekit.untrusted.clean_text`` (control and bidi characters become ``?``, long
  names are cut). The CLI's ``edgekit.cli.render`` and the TUI's ``edgekit.tui.shown`` wrap
  it in rich ``Text`` / Textual ``Content`` so markup in a name is never read as markup.
- **Content** a model generated (``edgekit run``, ``chat``, the TUI's chat): as untrusted
  as a file, but its line breaks and tabs are the text. ``OutputCleaner`` removes terminal
  escape sequences whole (CSI, OSC such as titles and OSC 8 links, DCS/APC/PM/SOS strings,
  two-character escapes, and their C1 forms) even when a sequence is split across
  streamed chunks, and ``strip_controls`` removes every other control character but
  newline and tab, plus the bidi embeddings, overrides and isolates; zero-width joiners
  and the LRM/RLM marks stay (emoji sequences and right-to-left text need them).
- **Log records**: ``CleanLogRecords`` is a logging filter for a handler; it cleans a
  record's message, arguments and traceback text, so a name with an escape sequence or a
  line break cannot rewrite the terminal or forge a log line.
"""

from __future__ import annotations

import logging
import numbers
import re
from typing import Any

from edgekit.untrusted import clean_text

#: Longest log message (and traceback line) kept; longer ones are cut with an ellipsis.
LOG_TEXT_MAX = 4000
#: What each line of a logged traceback starts with.
TRACEBACK_INDENT = "  "
#: Longest escape sequence held back across chunks; longer "sequences" are shown as text.
MAX_SEQUENCE = 1024

ESC = "\x1b"
CSI_C1 = "\x9b"
# Introducers of string sequences: ESC ] (OSC), P (DCS), X (SOS), ^ (PM), _ (APC), and
# their C1 forms; each runs to ST (ESC \ or 0x9C) or BEL.
_STRING_AFTER_ESC = "]PX^_"
_STRING_C1 = "\x90\x98\x9d\x9e\x9f"
_ST_C1 = "\x9c"
BEL = "\x07"

# What strip_controls removes: C0 controls but tab and newline, DEL, C1 controls, and the
# bidi embeddings, overrides and isolates that reorder what a reader sees.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_SURROGATES = re.compile("[\ud800-\udfff]")
# What ends a string sequence: BEL, ST, or an ESC (of ESC \, or of a new sequence).
_STRING_STOP = re.compile("[\x07\x9c\x1b]")


def strip_controls(text: str) -> str:
    """``text`` without control characters (newline and tab stay) and bidi controls; a lone
    surrogate, which no terminal encoding can write, becomes U+FFFD."""
    return _SURROGATES.sub("\ufffd", _CONTROLS.sub("", text))


def _csi_end(buf: str, j: int) -> int | None:
    """End of a CSI sequence whose parameters start at ``j``; None when ``buf`` ends first."""
    while j < len(buf) and "\x30" <= buf[j] <= "\x3f":  # parameter bytes
        j += 1
    while j < len(buf) and "\x20" <= buf[j] <= "\x2f":  # intermediate bytes
        j += 1
    if j >= len(buf):
        return None
    # a final byte ends it; anything else ends a malformed sequence before that character
    return j + 1 if "\x40" <= buf[j] <= "\x7e" else j


def _string_end(buf: str, j: int) -> int | None:
    """End of a string sequence (OSC, DCS...) whose body starts at ``j``."""
    found = _STRING_STOP.search(buf, j)
    if found is None:
        return None
    k = found.start()
    if buf[k] != ESC:  # BEL or ST
        return k + 1
    if k + 1 >= len(buf):
        return None
    # ESC \ is the terminator; any other ESC aborts the string and starts anew
    return k + 2 if buf[k + 1] == "\\" else k


def _sequence_end(buf: str, i: int) -> int | None:
    """Index just past the escape sequence that starts at ``buf[i]``, or None when the
    buffer ends inside it."""
    c = buf[i]
    if c == CSI_C1:
        return _csi_end(buf, i + 1)
    if c in _STRING_C1:
        return _string_end(buf, i + 1)
    if i + 1 >= len(buf):
        return None
    n = buf[i + 1]
    if n == "[":
        return _csi_end(buf, i + 2)
    if n in _STRING_AFTER_ESC:
        return _string_end(buf, i + 2)
    j = i + 1
    while j < len(buf) and "\x20" <= buf[j] <= "\x2f":  # ESC ( B, ESC # 8 ...
        j += 1
    if j >= len(buf):
        return None
    return j + 1 if "\x30" <= buf[j] <= "\x7e" else i + 1  # ESC 7, ESC c ...; else ESC alone


class OutputCleaner:
    """Generated text as it streams, without escape sequences or control characters.

    ``feed`` returns what can be shown now; a chunk that ends inside an escape sequence
    keeps that tail until the next chunk completes it. ``flush`` returns what is left at
    the end (an unfinished sequence is dropped with its introducer; its body is text).
    """

    def __init__(self) -> None:
        self._pending = ""

    def feed(self, chunk: str) -> str:
        buf, self._pending = self._pending + chunk, ""
        out: list[str] = []
        i = 0
        while i < len(buf):
            c = buf[i]
            if c != ESC and c != CSI_C1 and c not in _STRING_C1:
                out.append(c)
                i += 1
                continue
            end = _sequence_end(buf, i)
            if end is None:
                if len(buf) - i <= MAX_SEQUENCE:
                    self._pending = buf[i:]
                    break
                end = i + 1  # too long to be a sequence: drop the introducer, show the rest
            i = end
        return strip_controls("".join(out))

    def flush(self) -> str:
        rest, self._pending = self._pending, ""
        return strip_controls(rest[1:]) if rest else ""


def clean_output(text: str) -> str:
    """A whole generated text, as ``OutputCleaner`` would stream it."""
    cleaner = OutputCleaner()
    return cleaner.feed(text) + cleaner.flush()


def clean_lines(text: str, *, indent: str = "", max_len: int = LOG_TEXT_MAX) -> str:
    """Several lines (a traceback), each cleaned as a name is and prefixed with ``indent``;
    the line breaks stay."""
    return "\n".join(indent + clean_text(line, max_len=max_len) for line in text.split("\n"))


class _Shown:
    """A log argument that is neither a string nor a number, shown cleaned by %s and %r."""

    __slots__ = ("_value",)

    def __init__(self, value: object) -> None:
        self._value = value

    def __str__(self) -> str:
        return clean_text(str(self._value), max_len=LOG_TEXT_MAX)

    def __repr__(self) -> str:
        return clean_text(repr(self._value), max_len=LOG_TEXT_MAX)

    def __format__(self, spec: str) -> str:
        return clean_text(format(self._value, spec), max_len=LOG_TEXT_MAX)


def _clean_arg(value: Any) -> Any:
    if value is None or isinstance(value, numbers.Number):
        return value  # %d and %.1f need the number itself
    if isinstance(value, str):
        return clean_text(value, max_len=LOG_TEXT_MAX)
    return _Shown(value)


class CleanLogRecords(logging.Filter):
    """A handler filter that makes every record safe to show: the message template (an
    f-string may carry a name), each argument, and the traceback text are cleaned of
    control and bidi characters, and each is one line (a traceback keeps its lines,
    indented).

    Install it on a handler, not a logger: a logger's filters see only the records logged
    on that very logger, a handler's see every record it writes. Records are changed in
    place (once, however many handlers clean them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "edgekit_cleaned", False):
            return True
        setattr(record, "edgekit_cleaned", True)  # noqa: B010 - not a LogRecord field
        msg = record.msg
        record.msg = clean_text(msg, max_len=LOG_TEXT_MAX) if isinstance(msg, str) else _Shown(msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_clean_arg(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _clean_arg(v) for k, v in record.args.items()}
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        # A traceback keeps its lines, indented under its record: an exception message
        # with a line break cannot start a line that reads as another record.
        if record.exc_text:
            record.exc_text = clean_lines(record.exc_text, indent=TRACEBACK_INDENT)
        if record.stack_info:
            record.stack_info = clean_lines(record.stack_info, indent=TRACEBACK_INDENT)
        return True
