"""Progress events: how long operations report what they are doing.

Library code calls a ``ProgressCallback`` with ``ProgressEvent`` values; the CLI renders
them as rich progress bars, the TUI as its own widgets, a script may log them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ProgressEvent:
    stage: str  # "convert", "quantize", "verify", ...
    done: int
    total: int | None  # None when the amount of work is not known
    detail: str = ""


ProgressCallback = Callable[[ProgressEvent], None]


def no_progress(_event: ProgressEvent) -> None:
    """The default callback: report nothing."""
