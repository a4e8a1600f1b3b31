"""Rich progress bars fed by edgekit ProgressEvents."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from edgekit.cli import err_console, render
from edgekit.progress import ProgressCallback, ProgressEvent

#: Characters of an event's detail (a file or variant name) shown beside its bar.
DETAIL_WIDTH = 40


@contextlib.contextmanager
def progress_bars(*, disable: bool = False) -> Iterator[ProgressCallback]:
    """A callback that draws one bar per stage on stderr (nothing when ``disable``).

    Stages and details name files and variants: the columns read no markup, and each
    text is cleaned to one line first."""
    tasks: dict[str, TaskID] = {}
    with Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        TextColumn("{task.fields[detail]}", markup=False),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=disable,
    ) as bar:

        def on_progress(event: ProgressEvent) -> None:
            if event.stage not in tasks:
                stage = render.name(event.stage, max_len=DETAIL_WIDTH).plain
                tasks[event.stage] = bar.add_task(stage, total=event.total, detail="")
            bar.update(
                tasks[event.stage],
                completed=event.done,
                total=event.total,
                detail=render.text(event.detail).plain[-DETAIL_WIDTH:],
            )

        yield on_progress
