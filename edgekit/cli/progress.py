"""Rich progress bars fed by edgekit ProgressEvents."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from edgekit.cli import err_console
from edgekit.progress import ProgressCallback, ProgressEvent


@contextlib.contextmanager
def progress_bars(*, disable: bool = False) -> Iterator[ProgressCallback]:
    """A callback that draws one bar per stage on stderr (nothing when ``disable``)."""
    tasks: dict[str, TaskID] = {}
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=disable,
    ) as bar:

        def on_progress(event: ProgressEvent) -> None:
            if event.stage not in tasks:
                tasks[event.stage] = bar.add_task(event.stage, total=event.total, detail="")
            bar.update(
                tasks[event.stage],
                completed=event.done,
                total=event.total,
                detail=event.detail[-40:],
            )

        yield on_progress
