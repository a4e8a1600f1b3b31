"""The TUI's thread workers: whatever one raises, an edgekit error or anything else, is a
notification (its message, and the edgekit hint) and the app keeps running.

A pane runs its slow work with ``@background(group)`` (a thread worker that does not
take the app down when it fails: Textual's ``exit_on_error`` is off) and, in its
``on_worker_state_changed``, calls ``report_failure``, which shows the failure of any of
its workers and tells it which one failed, so it can put itself back (a chat no longer
generating, a bench no longer running).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual import work
from textual.worker import Worker, WorkerState

if TYPE_CHECKING:
    from edgekit.tui.app import EdgekitApp


def background(group: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A thread worker of ``group`` (one at a time) whose failure is reported, not raised."""
    decorate: Callable[[Callable[..., Any]], Callable[..., Any]] = work(
        thread=True, exclusive=True, group=group, exit_on_error=False
    )
    return decorate


def report_failure(app: EdgekitApp, event: Worker.StateChanged) -> str | None:
    """The group of the worker that just failed (its failure now a notification), or None
    when ``event`` is not a failure."""
    error = event.worker.error
    if event.state != WorkerState.ERROR or error is None:
        return None
    app.report(error, title=event.worker.group)
    return event.worker.group
